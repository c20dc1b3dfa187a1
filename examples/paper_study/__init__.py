"""The paper's study in pieces, behind ``examples/reproduce_paper.py``: the presets (``presets``), the plan and the
arms' configs (``plan``), one piece trained, sampled and committed (``pieces``), the comparison table (``table``) and
the report built from committed pieces (``report``)."""
