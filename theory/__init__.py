"""Closed-form theory of SD, SSD and Saguaro (docs/ssd.md): numpy and scipy only, no torch, no simpy.

Files: `glossary` (notation, enums), `speedup` (E, SD/SSD speedups, Thm 7, Cor. 8/9/16), `powerlaw`
(Def. 11 miss model, fit of r), `fanout` (Thm 12 schedules), `saguaro` (Def. 14 sampling, exact hit
probability, Thm 15), `backup` (backup choice and critical batch size b*), `adaptive` (the K that
maximises tokens per unit time, the running α estimate).
"""

from theory.adaptive import acceptance_estimate, best_K, heuristic_K, round_rate, updated_counts
from theory.backup import BackupOption, backup_speedups, best_backup, critical_batch_size
from theory.fanout import (
    expected_hit_probability,
    integer_fanout,
    optimal_fanout,
    outcome_probabilities,
    uniform_fanout,
)
from theory.glossary import Backup, MissPolicy, Strategy
from theory.powerlaw import PowerLawFit, fit_r, miss_rate
from theory.saguaro import SaguaroPosition, all_accepted_hit_probability, saguaro_position, saguaro_q
from theory.speedup import (
    acceptance_rate,
    ar_tokens_per_second,
    expected_tokens,
    sd_speedup,
    sd_tokens_per_second,
    ssd_over_sd_ceiling,
    ssd_over_sd_neural,
    ssd_speedup,
)

__all__ = [
    "Backup",
    "BackupOption",
    "MissPolicy",
    "PowerLawFit",
    "SaguaroPosition",
    "Strategy",
    "acceptance_estimate",
    "acceptance_rate",
    "all_accepted_hit_probability",
    "ar_tokens_per_second",
    "backup_speedups",
    "best_K",
    "best_backup",
    "critical_batch_size",
    "expected_hit_probability",
    "expected_tokens",
    "fit_r",
    "heuristic_K",
    "integer_fanout",
    "miss_rate",
    "optimal_fanout",
    "outcome_probabilities",
    "round_rate",
    "saguaro_position",
    "saguaro_q",
    "sd_speedup",
    "sd_tokens_per_second",
    "ssd_over_sd_ceiling",
    "ssd_over_sd_neural",
    "ssd_speedup",
    "uniform_fanout",
    "updated_counts",
]
