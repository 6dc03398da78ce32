import sys, cProfile, pstats, torch, warnings
sys.path.insert(0, ".")
warnings.simplefilter("ignore")
import lowprec as lp
from benchmarks.bench_gpu_emulate import build
model = build("1b", "cuda")
ids = torch.randint(0, 32000, (1, 2048), generator=torch.Generator().manual_seed(0)).cuda()
def fwd():
    with torch.no_grad(), lp.emulate("hif8", model=model):
        model(ids, logits_to_keep=1)
    torch.cuda.synchronize()
fwd(); fwd()
pr = cProfile.Profile(); pr.enable()
for _ in range(3): fwd()
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(35)
st.sort_stats("cumulative").print_stats(45)
