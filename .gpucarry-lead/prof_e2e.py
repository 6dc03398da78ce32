import sys, time, torch, warnings
sys.path.insert(0, ".")
warnings.simplefilter("ignore")
import lowprec as lp
from benchmarks.bench_gpu_emulate import build
from torch.profiler import profile, ProfilerActivity
L = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
model = build("1b", "cuda")
ids = torch.randint(0, 32000, (1, L), generator=torch.Generator().manual_seed(0)).cuda()
comp = torch.compile(model)
def fwd(m, s):
    with torch.no_grad(), lp.emulate(s, model=model):
        m(ids, logits_to_keep=1)
for tag, m in (("eager", model), ("compiled", comp)):
    for s in ("hif8", "flash"):
        fwd(m, s); fwd(m, s); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            fwd(m, s); torch.cuda.synchronize()
        print(f"===== {tag} {s}")
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
        print(p.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=60))
# mask seen by SDPA in each mode
import torch.nn.functional as F
seen = []
orig = F.scaled_dot_product_attention
def spy(*a, **k):
    m = k.get("attn_mask", a[3] if len(a) > 3 else None)
    seen.append((None if m is None else (tuple(m.shape), m.dtype), k.get("is_causal"), k.get("enable_gqa"), tuple(a[1].shape)))
    return orig(*a, **k)
F.scaled_dot_product_attention = spy
with torch.no_grad(): model(ids, logits_to_keep=1)
print("eager SDPA args:", seen[0])
