"""A tensor-parallel target: `start_target` runs the target over N ranks with transformers' own tensor
parallelism on torch.distributed (gloo on CPUs, NCCL on GPUs); this process is rank 0 and samples, the engine
starts the other ranks itself. `TPRankDied`: a rank left and the run cannot go on."""

from engine.tp.target import TPRankDied, TPTarget, start_target

__all__ = ["TPRankDied", "TPTarget", "start_target"]
