"""SimPy simulator of AR, SD and SSD timing, and capacity planning (depends on theory and simpy, never engine).

Parts (one concept per file): `timing` (constant and roofline models) and `fit` (fitted from engine records) with
`hardware`/`presets`; `acceptance` and `draws` (i.i.d., per-position, power-law hits, replay); `workload` (closed and
open loops, replayed request logs); `link`; `processes` (the actors); `run` (config -> result); `scenario` (sweeps);
`plan` (capacity); `validate` (against the engine); `trace` (Chrome trace).
"""

from simulator.acceptance import ConstantHit, IidAcceptance, PerPositionAcceptance, PowerLawHit, Replay
from simulator.fit import FittedTiming, fit_timing
from simulator.hardware import Deployment, Hardware, ModelSpec
from simulator.link import LinkSpec
from simulator.metrics import SimResult
from simulator.plan import LatencyTarget, PlanResult, plan
from simulator.records import RoundRecord, read_records
from simulator.run import Policy, SimConfig, rounds_per_second, simulate, uniform_fanout
from simulator.scenario import Grid, SaguaroTable, Scenario, sweep
from simulator.timing import ConstantTiming, RooflineTiming
from simulator.trace import write_chrome_trace
from simulator.validate import validate
from simulator.workload import ClosedLoop, Lengths, OpenLoop, Replayed

__all__ = [
    "ClosedLoop",
    "ConstantHit",
    "ConstantTiming",
    "Deployment",
    "FittedTiming",
    "Grid",
    "Hardware",
    "IidAcceptance",
    "LatencyTarget",
    "Lengths",
    "LinkSpec",
    "ModelSpec",
    "OpenLoop",
    "PerPositionAcceptance",
    "PlanResult",
    "Policy",
    "PowerLawHit",
    "Replay",
    "Replayed",
    "RooflineTiming",
    "RoundRecord",
    "SaguaroTable",
    "Scenario",
    "SimConfig",
    "SimResult",
    "fit_timing",
    "plan",
    "read_records",
    "rounds_per_second",
    "simulate",
    "sweep",
    "uniform_fanout",
    "validate",
    "write_chrome_trace",
]
