"""privseed's Prefect flows and the command line: each flow only wires the stages of ``tasks/`` together, in the
order of its pipeline diagram; every task, and every function a flow shares with another, lives in ``tasks/``.

Flows do not import flows. The one exception is a flow that composes others as subflows, and it imports their
``@flow`` functions only: ``experiment`` runs ``dpkps_flow``, ``augpe_flow`` and ``secpe_flow``; ``demo`` runs
``dpkps_flow`` and ``evaluate``. So a change to one method's flow file cannot break another method
(tests/test_architecture.py checks this).
"""
