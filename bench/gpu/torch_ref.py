"""The reference figures on the same GPU: the dflow target model's shape
(internal/nn benchConfig: vocab 256, d_model 128, 4 layers, 4 heads,
SwiGLU 352, pre-norm RMSNorm, tied head) in PyTorch, fp32 with TF32 off
(dflow's cuBLAS products are plain fp32), forward and training tokens/s at
B=8 and 64, T=128, and a 4096^3 fp32 matmul's TFLOP/s."""
import time
import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
V, D, L, NH, H, T = 256, 128, 4, 4, 352, 128


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.RMSNorm(D, eps=1e-5), torch.nn.RMSNorm(D, eps=1e-5)
        self.qkv, self.proj = torch.nn.Linear(D, 3 * D, bias=False), torch.nn.Linear(D, D, bias=False)
        self.fc, self.mproj = torch.nn.Linear(D, 2 * H, bias=False), torch.nn.Linear(H, D, bias=False)

    def forward(self, x):
        B = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, NH, D // NH).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(a)
        g, u = self.fc(self.ln2(x)).chunk(2, dim=-1)
        return x + self.mproj(F.silu(g) * u)


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(T, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.lnf = torch.nn.RMSNorm(D, eps=1e-5)

    def forward(self, tok):
        x = self.wte(tok) + self.wpe.weight[: tok.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.lnf(x) @ self.wte.weight.T


def rate(fn, n):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


m = LM().to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
print("torch", torch.__version__, torch.cuda.get_device_name())
for B in (8, 64):
    tok = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)

    def fwd():
        with torch.no_grad():
            m(tok)

    def train():
        loss = F.cross_entropy(m(tok).view(-1, V), tgt.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    print(f"torch forward B{B}: {rate(fwd, 50) * B * T:.0f} tokens/s")
    print(f"torch train   B{B}: {rate(train, 30) * B * T:.0f} tokens/s")
n = 4096
a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
print(f"torch fp32 matmul 4096^3: {rate(lambda: a @ b.T, 20) * 2 * n**3 / 1e12:.1f} TFLOP/s")
