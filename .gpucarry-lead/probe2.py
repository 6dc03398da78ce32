import sys, time, torch, warnings
sys.path.insert(0, ".")
warnings.simplefilter("ignore")
import lowprec as lp
import lowprec.kernels.device as D
from benchmarks.bench_gpu_emulate import build
L = 2048
log = []
orig = D.attention_device
def spy(scheme, q, k, v, *a, **kw):
    m = kw.get("attn_mask")
    log.append(dict(q=(str(q.dtype), tuple(q.shape), q.stride()), k=(str(k.dtype), tuple(k.shape), k.stride()),
                    mask=None if m is None else (str(m.dtype), tuple(m.shape), m.stride()),
                    causal=kw.get("causal"), gqa=kw.get("gqa"), opts=sorted(kw)))
    return orig(scheme, q, k, v, *a, **kw)
D.attention_device = spy
import lowprec.kernels as K
for mod in list(sys.modules.values()):
    if mod and getattr(mod, "attention_device", None) is orig:
        mod.attention_device = spy
# engine micro-benchmark
def t_ms(fn, n=10):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2]
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(1, 32, L, 64, device="cuda", generator=g).bfloat16()
k = torch.randn(1, 8, L, 64, device="cuda", generator=g).bfloat16().repeat_interleave(4, dim=1)
v = torch.randn(1, 8, L, 64, device="cuda", generator=g).bfloat16().repeat_interleave(4, dim=1)
cm = torch.ones(L, L, dtype=torch.bool, device="cuda").tril()
F = torch.nn.functional
for sch, opt in (("baps", dict(config="e2e_hif8")), ("flash", {})):
    r = {}
    r["noncausal"] = t_ms(lambda: lp.attention(q, k, v, sch, **opt))
    r["causal"] = t_ms(lambda: lp.attention(q, k, v, sch, causal=True, **opt))
    r["causal+stats"] = t_ms(lambda: lp.attention(q, k, v, sch, causal=True, return_stats=True, **opt))
    r["boolmask"] = t_ms(lambda: lp.attention(q, k, v, sch, attn_mask=cm, **opt))
    r["causal+mask_stats"] = t_ms(lambda: lp.attention(q, k, v, sch, attn_mask=cm[None, None], return_stats=True, **opt))
    r["boolmask4d"] = t_ms(lambda: lp.attention(q, k, v, sch, attn_mask=cm[None, None], **opt))
    r["fp32 causal"] = t_ms(lambda: lp.attention(q.float(), k.float(), v.float(), sch, causal=True, **opt))
    print(sch, {a: round(b, 3) for a, b in r.items()})
print("sdpa bf16 causal", round(t_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), 3),
      "fp32", round(t_ms(lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)), 3))
