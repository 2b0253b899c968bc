"""How much one run's headline figures move from run to run (pure): a policy run ``repeat``
times on fresh fabrics gives, per figure, the median, the smallest and the largest value and
every value, in the modelled fabric's time (results.json's ``spread``)."""
from __future__ import annotations

from statistics import median
from typing import Callable, Dict, Optional, Sequence

from .model import PolicyResult, entry_of, figure_at


# figure -> its value in a policy's result (modelled time); unit in the name
HEADLINE: Dict[str, Callable[[PolicyResult], Optional[float]]] = {
    "iteration_p50_us": lambda p: figure_at(p.iteration_us, "p50"),
    "iteration_p99_us": lambda p: figure_at(p.iteration_us, "p99"),
    "full_size_iteration_ms": lambda p: figure_at(p.job, "full_size_iteration_ms_modelled"),
    "network_cost_us": lambda p: p.network_cost_us,
    "exposed_comm_us": lambda p: entry_of(p.exposed_comm_us, "total"),
    "exposed_share": lambda p: figure_at(p.job, "exposed_share"),
    "idle_gpu_us": lambda p: p.idle_gpu_us,
    "cct_p50_us": lambda p: figure_at(p.cct_us, "p50"),
    "cct_p99_us": lambda p: figure_at(p.cct_us, "p99"),
    "busbw_gbps": lambda p: p.busbw_gbps_modelled,
    "latency_p99_us": lambda p: figure_at(p.latency_us, "p99"),
    "drops": lambda p: p.drops,
    "retransmitted_packets": lambda p: p.retransmitted_packets,
    "ecn_marked_packets": lambda p: p.ecn_marked_packets,
    "pfc_pause_events": lambda p: p.pfc_pause_events,
}


def spread(runs: Sequence[PolicyResult]) -> Dict[str, dict]:
    """Per headline figure that the runs (in modelled time) have: {median, min, max, values}
    over them; a run without the figure (a failed job's iteration) is left out of it."""
    out = {}
    for name, get in HEADLINE.items():
        values = [v for v in (get(p) for p in runs) if v is not None]
        if values:
            out[name] = {"median": median(values), "min": min(values), "max": max(values),
                         "values": values}
    return out
