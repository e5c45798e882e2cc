// Package cudakern holds the CUDA C source of the CUDA backend's kernels
// (internal/nn, -tags cuda) and the host-side plans that launch them: the
// grid and block of each kernel and the translation of the package's
// row-major matrix products into cuBLAS's column-major calls. It imports
// no CUDA library, so its plans are tested in every build, and its
// source is compiled through NVRTC by the cuda build's tests
// (compile_cuda_test.go) on machines without a GPU.
//
// Every kernel parameter is 8 bytes (a device pointer, a long long or a
// double): gorgonia.org/cu's Function.Launch copies each argument as a
// uint64, so a 4-byte int or float parameter would be read wrongly.
package cudakern

// Block is the thread count of the kernels that reduce a row in a block
// (BlockSum's shared memory holds one value per warp of it).
const Block = 256

// Names are the kernels of Source, each an extern "C" __global__ function:
// the PTX of Source has one .entry per name.
var Names = []string{
	"scale_k", "add_k", "accumulate_k",
	"embedding_k", "embedding_backward_k", "add_positions_k", "positions_backward_k",
	"rmsnorm_k", "rmsnorm_backward_dx_k", "rmsnorm_backward_dw_k",
	"bias_add_k", "bias_backward_k",
	"swiglu_k", "swiglu_backward_k",
	"attention_softmax_k", "attention_softmax_backward_k",
	"softmax_rows_k", "ce_loss_rows_k", "ce_wsum_k", "ce_backward_k",
	"argmax_rows_k",
	"block_input_k", "block_input_dwpe_k", "block_input_dmask_k", "add_context_k", "context_backward_k",
	"sum_squares_k", "adamw_k",
}

// Source is the CUDA C of every kernel. Shapes and semantics are those of
// the CPU kernels of internal/nn (row-major, a linear weight [Out, In]);
// the float64 accumulations of the CPU (RMSNorm's sum of squares, the
// cross-entropy's softmax and loss, SumSquares) are double here too.
const Source = `
typedef long long i64;
#define NEG_INF __int_as_float(0xff800000)

extern "C" {

__device__ __forceinline__ float warp_sum(float v) {
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}
__device__ __forceinline__ double warp_sumd(double v) {
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}
__device__ __forceinline__ float warp_max(float v) {
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// block_sum and block_sumd: the sum over the block (blockDim.x a multiple
// of 32, at most 1024), returned to every thread.
__device__ float block_sum(float v) {
	__shared__ float s[32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sum(v);
	__syncthreads();
	if (lane == 0) s[w] = v;
	__syncthreads();
	v = (int)threadIdx.x < nw ? s[threadIdx.x] : 0.0f;
	if (w == 0) v = warp_sum(v);
	if (threadIdx.x == 0) s[0] = v;
	__syncthreads();
	return s[0];
}
__device__ double block_sumd(double v) {
	__shared__ double s[32];
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = warp_sumd(v);
	__syncthreads();
	if (lane == 0) s[w] = v;
	__syncthreads();
	v = (int)threadIdx.x < nw ? s[threadIdx.x] : 0.0;
	if (w == 0) v = warp_sumd(v);
	if (threadIdx.x == 0) s[0] = v;
	__syncthreads();
	return s[0];
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// The CPU's sigmoid: float32(1 / (1 + exp(-float64(x)))).
__device__ __forceinline__ float sigm(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

__global__ void scale_k(float* x, i64 n, double f) {
	float g = (float)f;
	GRID_STRIDE(i, n) x[i] *= g;
}
__global__ void add_k(float* out, const float* a, const float* b, i64 n) {
	GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void accumulate_k(float* dst, const float* src, i64 n) {
	GRID_STRIDE(i, n) dst[i] += src[i];
}

__global__ void embedding_k(float* out, const int* tokens, const float* table, i64 N, i64 D) {
	GRID_STRIDE(i, N * D) out[i] = table[(i64)tokens[i / D] * D + i % D];
}
// Rows of tokens that repeat add into one row of dtable: atomics, so the
// order of the additions is not the CPU's (rounding only).
__global__ void embedding_backward_k(float* dtable, const int* tokens, const float* dout, i64 N, i64 D) {
	GRID_STRIDE(i, N * D) atomicAdd(&dtable[(i64)tokens[i / D] * D + i % D], dout[i]);
}
__global__ void add_positions_k(float* x, const float* wpe, i64 N, i64 T, i64 D) {
	GRID_STRIDE(i, N * D) x[i] += wpe[((i / D) % T) * D + i % D];
}
// One thread per value of dwpe [T, D]: the rows n = t, t+T, ... in order.
__global__ void positions_backward_k(float* dwpe, const float* dx, i64 N, i64 T, i64 D) {
	GRID_STRIDE(i, T * D) {
		i64 t = i / D, c = i % D;
		float s = 0;
		for (i64 n = t; n < N; n += T) s += dx[n * D + c];
		dwpe[i] += s;
	}
}

// One block per row.
__global__ void rmsnorm_k(float* out, float* rstd, const float* x, const float* w, i64 N, i64 D, double eps) {
	i64 n = blockIdx.x;
	const float* r = x + n * D;
	double ss = 0;
	for (i64 i = threadIdx.x; i < D; i += blockDim.x) ss += (double)r[i] * (double)r[i];
	ss = block_sumd(ss);
	float rs = (float)(1.0 / sqrt(ss / (double)D + eps));
	if (threadIdx.x == 0) rstd[n] = rs;
	for (i64 i = threadIdx.x; i < D; i += blockDim.x) out[n * D + i] = r[i] * rs * w[i];
}
// dx (one block per row): dx_j += r w_j g_j - r^3 x_j / D sum_i g_i w_i x_i.
__global__ void rmsnorm_backward_dx_k(float* dx, const float* dout, const float* x, const float* w, const float* rstd, i64 N, i64 D) {
	i64 n = blockIdx.x;
	const float *r = x + n * D, *g = dout + n * D;
	float dot = 0;
	for (i64 i = threadIdx.x; i < D; i += blockDim.x) dot += g[i] * w[i] * r[i];
	dot = block_sum(dot);
	float rs = rstd[n];
	float c = rs * rs * rs * dot / (float)D;
	for (i64 i = threadIdx.x; i < D; i += blockDim.x) dx[n * D + i] += rs * w[i] * g[i] - c * r[i];
}
// dweight (one thread per column): sum over rows of g x r.
__global__ void rmsnorm_backward_dw_k(float* dw, const float* dout, const float* x, const float* rstd, i64 N, i64 D) {
	GRID_STRIDE(i, D) {
		float s = 0;
		for (i64 n = 0; n < N; n++) s += dout[n * D + i] * x[n * D + i] * rstd[n];
		dw[i] += s;
	}
}

__global__ void bias_add_k(float* out, const float* bias, i64 N, i64 Out) {
	GRID_STRIDE(i, N * Out) out[i] += bias[i % Out];
}
__global__ void bias_backward_k(float* dbias, const float* dout, i64 N, i64 Out) {
	GRID_STRIDE(i, Out) {
		float s = 0;
		for (i64 n = 0; n < N; n++) s += dout[n * Out + i];
		dbias[i] += s;
	}
}

// h [N, 2H] is gate | up per row; out [N, H].
__global__ void swiglu_k(float* out, const float* h, i64 N, i64 H) {
	GRID_STRIDE(i, N * H) {
		i64 n = i / H, c = i % H;
		float g = h[n * 2 * H + c], u = h[n * 2 * H + H + c];
		out[i] = g * sigm(g) * u;
	}
}
__global__ void swiglu_backward_k(float* dh, const float* dout, const float* h, i64 N, i64 H) {
	GRID_STRIDE(i, N * H) {
		i64 n = i / H, c = i % H;
		float x = h[n * 2 * H + c], u = h[n * 2 * H + H + c], g = dout[i];
		float s = sigm(x);
		dh[n * 2 * H + H + c] += g * x * s;
		dh[n * 2 * H + c] += g * u * s * (1 + x * (1 - s));
	}
}

// Attention's softmax over rows of att [rows, T] (rows = B*NH*T), in
// place, one warp per row: row r is position t = r % T, which sees
// positions < t+1 when causal (the rest is set to 0).
__global__ void attention_softmax_k(float* att, i64 rows, i64 T, i64 causal) {
	i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x & 31;
	if (r >= rows) return;
	float* row = att + r * T;
	i64 end = causal ? r % T + 1 : T;
	float mx = NEG_INF;
	for (i64 i = lane; i < end; i += 32) mx = fmaxf(mx, row[i]);
	mx = warp_max(mx);
	float sum = 0;
	for (i64 i = lane; i < end; i += 32) {
		float e = (float)exp((double)(row[i] - mx));
		row[i] = e;
		sum += e;
	}
	sum = warp_sum(sum);
	float inv = 1 / sum;
	for (i64 i = lane; i < end; i += 32) row[i] *= inv;
	for (i64 i = end + lane; i < T; i += 32) row[i] = 0;
}
// The softmax's backward on ds = dO V^T (one warp per row):
// ds = p * (ds - rowsum(p * ds)) * scale, 0 beyond the causal end.
__global__ void attention_softmax_backward_k(float* ds, const float* p, i64 rows, i64 T, i64 causal, double scale) {
	i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	int lane = threadIdx.x & 31;
	if (r >= rows) return;
	float* dr = ds + r * T;
	const float* pr = p + r * T;
	i64 end = causal ? r % T + 1 : T;
	float dot = 0;
	for (i64 i = lane; i < end; i += 32) dot += pr[i] * dr[i];
	dot = warp_sum(dot);
	float sc = (float)scale;
	for (i64 i = lane; i < end; i += 32) dr[i] = pr[i] * (dr[i] - dot) * sc;
	for (i64 i = end + lane; i < T; i += 32) dr[i] = 0;
}

// The cross-entropy's softmax of logits [N, V] into probs, one block per
// row, in double as the CPU's.
__global__ void softmax_rows_k(float* probs, const float* logits, i64 N, i64 V) {
	__shared__ float smx[32];
	i64 n = blockIdx.x;
	const float* x = logits + n * V;
	float mx = NEG_INF;
	for (i64 i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
	mx = warp_max(mx);
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	if (lane == 0) smx[w] = mx;
	__syncthreads();
	mx = NEG_INF;
	for (int i = 0; i < nw; i++) mx = fmaxf(mx, smx[i]);
	double sum = 0;
	for (i64 i = threadIdx.x; i < V; i += blockDim.x) sum += exp((double)(x[i] - mx));
	sum = block_sumd(sum);
	float inv = (float)(1 / sum);
	for (i64 i = threadIdx.x; i < V; i += blockDim.x) probs[n * V + i] = (float)exp((double)(x[i] - mx)) * inv;
}
// Per row: loss[n] = -w log(max(p[target], 1e-30)) and wt[n] = w (both 0
// when target < 0); the host sums them in order.
__global__ void ce_loss_rows_k(double* loss, double* wt, const float* probs, const int* targets, const float* weights, i64 N, i64 V) {
	GRID_STRIDE(n, N) {
		int t = targets[n];
		if (t < 0) { loss[n] = 0; wt[n] = 0; continue; }
		double w = weights ? (double)weights[n] : 1.0;
		loss[n] = -w * log(fmax((double)probs[n * V + t], 1e-30));
		wt[n] = w;
	}
}
// The weight sum of the rows with a target, into wsum[0] (one block).
__global__ void ce_wsum_k(double* wsum, const int* targets, const float* weights, i64 N) {
	double s = 0;
	for (i64 n = threadIdx.x; n < N; n += blockDim.x)
		if (targets[n] >= 0) s += weights ? (double)weights[n] : 1.0;
	s = block_sumd(s);
	if (threadIdx.x == 0) wsum[0] = s;
}
// dlogits += w (p - onehot(target)), w = weight / wsum; one block per row.
__global__ void ce_backward_k(float* dlogits, const float* probs, const int* targets, const float* weights, const double* wsum, i64 N, i64 V) {
	i64 n = blockIdx.x;
	int t = targets[n];
	double ws = wsum[0];
	if (t < 0 || ws == 0) return;
	float w = weights ? (float)((double)weights[n] / ws) : (float)(1 / ws);
	for (i64 i = threadIdx.x; i < V; i += blockDim.x) {
		float v = dlogits[n * V + i] + w * probs[n * V + i];
		if (i == t) v -= w;
		dlogits[n * V + i] = v;
	}
}

// The index of each row's largest value, the first of equals; one block
// per row.
__global__ void argmax_rows_k(int* out, const float* x, i64 N, i64 V) {
	__shared__ float sv[1024];
	__shared__ int si[1024];
	i64 n = blockIdx.x;
	float best = NEG_INF;
	int bi = -1;
	for (i64 i = threadIdx.x; i < V; i += blockDim.x) {
		float v = x[n * V + i];
		if (bi < 0 || v > best) { best = v; bi = (int)i; }
	}
	sv[threadIdx.x] = best;
	si[threadIdx.x] = bi;
	__syncthreads();
	for (int s = blockDim.x / 2; s > 0; s >>= 1) {
		if ((int)threadIdx.x < s) {
			float v = sv[threadIdx.x + s];
			int j = si[threadIdx.x + s];
			if (j >= 0 && (si[threadIdx.x] < 0 || v > sv[threadIdx.x] || (v == sv[threadIdx.x] && j < si[threadIdx.x]))) {
				sv[threadIdx.x] = v;
				si[threadIdx.x] = j;
			}
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) out[n] = si[0] < 0 ? 0 : si[0];
}

// The drafter's block input: row (s, j) of x0 [S*P, D] is wpe[j] plus
// wte[anchors[s]] for j = 0, mask for j > 0.
__global__ void block_input_k(float* x0, const int* anchors, const float* wte, const float* mask, const float* wpe, i64 S, i64 P, i64 D) {
	GRID_STRIDE(i, S * P * D) {
		i64 row = i / D, c = i % D, s = row / P, j = row % P;
		float src = j == 0 ? wte[(i64)anchors[s] * D + c] : mask[c];
		x0[i] = src + wpe[j * D + c];
	}
}
__global__ void block_input_dwpe_k(float* dwpe, const float* dx, i64 S, i64 P, i64 D) {
	GRID_STRIDE(i, P * D) {
		i64 j = i / D, c = i % D;
		float s = 0;
		for (i64 k = 0; k < S; k++) s += dx[(k * P + j) * D + c];
		dwpe[i] += s;
	}
}
__global__ void block_input_dmask_k(float* dmask, const float* dx, i64 S, i64 P, i64 D) {
	GRID_STRIDE(c, D) {
		float s = 0;
		for (i64 k = 0; k < S; k++)
			for (i64 j = 1; j < P; j++) s += dx[(k * P + j) * D + c];
		dmask[c] += s;
	}
}
// The drafter's fusion: row n of out = row n of x + row n/P of ctx.
__global__ void add_context_k(float* out, const float* x, const float* ctx, i64 N, i64 P, i64 D) {
	GRID_STRIDE(i, N * D) out[i] = x[i] + ctx[(i / D / P) * D + i % D];
}
// dctx [ceil(N/P), D] += the sum of the P rows of dout it fed.
__global__ void context_backward_k(float* dctx, const float* dout, i64 N, i64 P, i64 D) {
	i64 R = (N + P - 1) / P;
	GRID_STRIDE(i, R * D) {
		i64 r = i / D, c = i % D;
		float s = 0;
		for (i64 n = r * P; n < N && n < (r + 1) * P; n++) s += dout[n * D + c];
		dctx[i] += s;
	}
}

// Partial sums of squares in double, one per block, into part[gridDim.x].
__global__ void sum_squares_k(double* part, const float* x, i64 n) {
	double s = 0;
	GRID_STRIDE(i, n) s += (double)x[i] * (double)x[i];
	s = block_sumd(s);
	if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// AdamW (see nn.AdamWStep); decay may be null (decay everything).
__global__ void adamw_k(float* params, const float* grads, float* m, float* v, const float* decay, i64 n,
		double lr, double beta1, double beta2, double eps, double wd, double scale, double bc1, double bc2) {
	float flr = (float)lr, b1 = (float)beta1, b2 = (float)beta2, fe = (float)eps, fwd = (float)wd,
		fs = (float)scale, c1 = (float)bc1, c2 = (float)bc2;
	GRID_STRIDE(i, n) {
		float g = grads[i] * fs;
		float mi = b1 * m[i] + (1 - b1) * g;
		float vi = b2 * v[i] + (1 - b2) * g * g;
		m[i] = mi;
		v[i] = vi;
		float mh = mi / c1, vh = vi / c2;
		float d = (decay && decay[i] == 0) ? 0.0f : fwd;
		params[i] -= flr * (mh / ((float)sqrt((double)vh) + fe) + d * params[i]);
	}
}

} // extern "C"
`
