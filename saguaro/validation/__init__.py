"""The simulator checked against what was measured (`saguaro validate`): held-out `saguaro bench` runs
(`engine`, reading run folders through `measured`), served runs (`serving`), every committed study's
held-out sets again (`audit`, reading `studies`), and the paper's table (`paper`). Nothing here imports torch."""
