import time, statistics, torch
torch.set_num_threads(1)
a = torch.randn(2048, 2048, dtype=torch.bfloat16); b = torch.randn(2048, 2048, dtype=torch.bfloat16)
m = torch.randn(64 * 1024 * 1024 // 4)
mm, ms = [], []
t_end = time.time() + 40
while time.time() < t_end:
    t0 = time.perf_counter(); a @ b; mm.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter(); m.sum(); ms.append((time.perf_counter() - t0) * 1e3)
q = len(mm) // 4
for i in range(4):
    print(f"quarter {i}: matmul {statistics.median(mm[i*q:(i+1)*q]):.1f} ms, sum {statistics.median(ms[i*q:(i+1)*q]):.1f} ms")
