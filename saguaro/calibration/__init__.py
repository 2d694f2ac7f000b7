"""What the simulator is fitted from: `saguaro calibrate`'s timed points (measure, with the draft in its own
process, draft_worker, and the target's rounds as the engine runs them, target_rounds), the calibration and
round-record files a fit reads (files), and the shipped hit tables built from bench runs (hit_tables).

Nothing is imported here, so that reading calibration files (`saguaro simulate --fit`, `saguaro validate`)
does not import torch."""
