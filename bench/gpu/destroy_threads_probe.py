"""Which threads do what while ProcessGroup.shutdown() of a used one-rank NCCL group runs (diagnostic).

    python3 bench/gpu/destroy_threads_probe.py
Samples every thread's name and syscall line (/proc/self/task/*/{comm,syscall}) every 2 ms during the
shutdown and prints each distinct (thread, syscall nr, args) state with the times it was seen."""
import os, threading, time
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
me = threading.get_native_id()
for how in ("shutdown", "destroy_process_group"):
    g = dist.new_group([0])
    x = torch.ones(1, device="cuda"); dist.all_reduce(x, group=g); torch.cuda.synchronize()
    time.sleep(0.1)
    seen, stop = {}, threading.Event()
    t0 = time.perf_counter()
    def watch():
        while not stop.is_set():
            for t in os.listdir("/proc/self/task"):
                try:
                    name = open(f"/proc/self/task/{t}/comm").read().strip()
                    sc = open(f"/proc/self/task/{t}/syscall").read().split()
                except OSError:
                    continue
                key = (t == str(me), name, sc[0], tuple(sc[1:4]))
                seen.setdefault(key, [time.perf_counter() - t0, 0])
                seen[key][1] += 1
            time.sleep(0.002)
    w = threading.Thread(target=watch); w.start()
    t1 = time.perf_counter()
    if how == "shutdown":
        g.shutdown(); dist.destroy_process_group(g)
    else:
        dist.destroy_process_group(g)
    dt = time.perf_counter() - t1
    stop.set(); w.join()
    print(f"== {how}: {dt:.3f} s; main tid {me}")
    for k, (first, n) in sorted(seen.items(), key=lambda kv: kv[1][0]):
        print(f"  {'MAIN ' if k[0] else '     '}{k[1]:<18} nr={k[2]:<4} args={k[3]} first {first:.3f}s x{n}")
dist.destroy_process_group()
