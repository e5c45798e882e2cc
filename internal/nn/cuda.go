//go:build cuda

package nn

/*
#include <cuda.h>
static int dflow_alloc_host(void** p, size_t n) { return (int)cuMemAllocHost(p, n); }
static int dflow_free_host(void* p) { return (int)cuMemFreeHost(p); }
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/dflow-dev/dflow/internal/nn/cudakern"
	"github.com/dflow-dev/dflow/internal/nn/cudalib"
	// The guard stops a cuda build on a machine without a GPU, in dflow's
	// words, before cu's init exits the process with its own.
	_ "github.com/dflow-dev/dflow/internal/nn/gpuguard"
)

// CUDAEnabled reports whether this build has the CUDA backend.
const CUDAEnabled = true

// cudaDevice is one GPU: its primary context (one per device, shared
// with any other CUDA code of the process), the kernels compiled for it
// by NVRTC and loaded once, and a pool of freed allocations by size.
type cudaDevice struct {
	ord  int
	ctx  cu.CUContext
	arch string
	fn   map[string]cu.Function
	mu   sync.Mutex
	pool map[int64][]cu.DevicePtr
}

var (
	cudaMu   sync.Mutex
	cudaDevs = map[int]*cudaDevice{}
)

func openDevice(ord int) (*cudaDevice, error) {
	cudaMu.Lock()
	defer cudaMu.Unlock()
	if d := cudaDevs[ord]; d != nil {
		return d, nil
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("nn: cuda: counting the GPUs: %v", err)
	}
	if ord >= n {
		return nil, fmt.Errorf("nn: device \"cuda:%d\": this machine has %d GPU(s), cuda:0 to cuda:%d", ord, n, n-1)
	}
	dev, err := cu.GetDevice(ord)
	if err != nil {
		return nil, fmt.Errorf("nn: cuda:%d: %v", ord, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx, err := dev.RetainPrimaryCtx()
	if err == nil {
		err = cu.SetCurrentContext(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("nn: cuda:%d: its context: %v", ord, err)
	}
	major, err1 := dev.Attribute(cu.ComputeCapabilityMajor)
	minor, err2 := dev.Attribute(cu.ComputeCapabilityMinor)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("nn: cuda:%d: its compute capability: %v %v", ord, err1, err2)
	}
	d := &cudaDevice{ord: ord, ctx: ctx, arch: cudaArch(major, minor), fn: map[string]cu.Function{}, pool: map[int64][]cu.DevicePtr{}}
	ptx, err := cudalib.CompileKernels(d.arch)
	if err != nil {
		return nil, fmt.Errorf("nn: cuda:%d: %v", ord, err)
	}
	mod, err := cu.LoadData(ptx)
	if err != nil {
		return nil, fmt.Errorf("nn: cuda:%d: loading the kernels' PTX (%s): %v", ord, d.arch, err)
	}
	for _, name := range cudakern.Names {
		f, err := mod.Function(name)
		if err != nil {
			return nil, fmt.Errorf("nn: cuda:%d: kernel %s: %v", ord, name, err)
		}
		d.fn[name] = f
	}
	cudaDevs[ord] = d
	return d, nil
}

// cudaArch is the virtual architecture the kernels are compiled for: the
// device's own, capped at compute_90 (the newest every supported NVRTC
// knows; the driver JIT-compiles its PTX for newer GPUs).
func cudaArch(major, minor int) string {
	if major*10+minor > 90 {
		return "compute_90"
	}
	return fmt.Sprintf("compute_%d%d", major, minor)
}

// cudaBackend is one replica's view of a device: its own stream and
// cuBLAS handle bound to it, and its own pinned staging and device
// scratch for what crosses to the host.
type cudaBackend struct {
	d      *cudaDevice
	stream cu.Stream
	blas   cudalib.Handle

	mu       sync.Mutex // the staging and the scratch
	pinned   unsafe.Pointer
	pinnedN  int
	scratch  cu.DevicePtr
	scratchN int
}

// cudaMem is one device allocation.
type cudaMem struct {
	be    *cudaBackend
	ptr   cu.DevicePtr
	bytes int64
}

func (m *cudaMem) backend() Backend { return m.be }

func openCUDA(ord int) (Backend, error) {
	d, err := openDevice(ord)
	if err != nil {
		return nil, err
	}
	be := &cudaBackend{d: d}
	defer be.enter()()
	if be.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return nil, fmt.Errorf("nn: cuda:%d: a stream: %v", ord, err)
	}
	if be.blas, err = cudalib.NewHandle(uintptr(unsafe.Pointer(be.stream.C()))); err != nil {
		return nil, fmt.Errorf("nn: cuda:%d: %v", ord, err)
	}
	return be, nil
}

// enter binds the device's context to the calling thread for one call:
// goroutines move between threads, a CUDA context is a thread's.
func (be *cudaBackend) enter() func() {
	runtime.LockOSThread()
	if err := cu.SetCurrentContext(be.d.ctx); err != nil {
		runtime.UnlockOSThread()
		panic(fmt.Sprintf("nn: cuda:%d: binding its context: %v", be.d.ord, err))
	}
	return runtime.UnlockOSThread
}

func (be *cudaBackend) check(err error, what string) {
	if err != nil {
		panic(fmt.Sprintf("nn: cuda:%d: %s: %v", be.d.ord, what, err))
	}
}

// mem is b's allocation, which must be on this device (nil for none).
func (be *cudaBackend) mem(b memory) *cudaMem {
	if b == nil {
		return nil
	}
	m, ok := b.(*cudaMem)
	if !ok {
		panic(fmt.Sprintf("nn: a %s buffer passed to the CUDA backend", b.backend().Name()))
	}
	return m
}

func (be *cudaBackend) local(b memory) *cudaMem {
	m := be.mem(b)
	if m != nil && m.be.d != be.d {
		panic(fmt.Sprintf("nn: a buffer of cuda:%d passed to a kernel on cuda:%d", m.be.d.ord, be.d.ord))
	}
	return m
}

// p is the kernel argument of a buffer: its device address (0 for none).
func (be *cudaBackend) p(b Buffer) uint64 {
	m := be.local(b.mem)
	if m == nil {
		return 0
	}
	return uint64(m.ptr) + 4*uint64(b.off)
}

func (be *cudaBackend) pi(b Ints) uint64 {
	m := be.local(b.mem)
	if m == nil {
		return 0
	}
	return uint64(m.ptr) + 4*uint64(b.off)
}

func i64(x int) uint64     { return uint64(int64(x)) }
func f64(x float64) uint64 { return math.Float64bits(x) }
func flag(x bool) uint64 {
	if x {
		return 1
	}
	return 0
}

// launch queues kernel name on the stream; every argument is 8 bytes
// (cudakern's rule).
func (be *cudaBackend) launch(name string, l cudakern.Launch, args ...uint64) {
	ptrs := make([]unsafe.Pointer, len(args))
	for i := range args {
		ptrs[i] = unsafe.Pointer(&args[i])
	}
	be.check(be.d.fn[name].Launch(l.Grid, 1, 1, l.Block, 1, 1, 0, be.stream, ptrs), name)
}

func (be *cudaBackend) Name() string { return "cuda" }

func (be *cudaBackend) alloc(n int) *cudaMem {
	bytes := int64(4 * max(n, 1))
	d := be.d
	d.mu.Lock()
	var ptr cu.DevicePtr
	if free := d.pool[bytes]; len(free) > 0 {
		ptr, d.pool[bytes] = free[len(free)-1], free[:len(free)-1]
	}
	d.mu.Unlock()
	if ptr == 0 {
		var err error
		ptr, err = cu.MemAlloc(bytes)
		be.check(err, fmt.Sprintf("allocating %d bytes", bytes))
	}
	be.check(cu.MemsetD32Async(ptr, 0, bytes/4, be.stream), "zeroing")
	return &cudaMem{be: be, ptr: ptr, bytes: bytes}
}

func (be *cudaBackend) Alloc(n int) Buffer {
	defer be.enter()()
	return Buffer{be.alloc(n), 0, n}
}

func (be *cudaBackend) AllocInts(n int) Ints {
	defer be.enter()()
	return Ints{be.alloc(n), 0, n}
}

// free returns an allocation to the device's pool once the stream is
// done with it (another replica may draw it next).
func (be *cudaBackend) free(b memory) {
	m := be.mem(b)
	if m == nil {
		return
	}
	defer be.enter()()
	be.check(be.stream.Synchronize(), "free")
	be.d.mu.Lock()
	be.d.pool[m.bytes] = append(be.d.pool[m.bytes], m.ptr)
	be.d.mu.Unlock()
}

func (be *cudaBackend) Free(b Buffer)   { be.free(b.mem) }
func (be *cudaBackend) FreeInts(b Ints) { be.free(b.mem) }
func (be *cudaBackend) Synchronize() {
	defer be.enter()()
	be.check(be.stream.Synchronize(), "synchronize")
}
func (be *cudaBackend) shares(o Backend) bool { _, ok := o.(*cudaBackend); return ok }

// staging returns the pinned host buffer, at least n bytes (be.mu held).
func (be *cudaBackend) staging(n int) unsafe.Pointer {
	if be.pinnedN < n {
		if be.pinned != nil {
			C.dflow_free_host(be.pinned)
		}
		size := max(n, 2*be.pinnedN, 1<<16)
		if r := C.dflow_alloc_host(&be.pinned, C.size_t(size)); r != 0 {
			panic(fmt.Sprintf("nn: cuda:%d: cuMemAllocHost(%d): error %d", be.d.ord, size, int(r)))
		}
		be.pinnedN = size
	}
	return be.pinned
}

// scratchBytes returns device scratch of at least n bytes (be.mu held).
func (be *cudaBackend) scratchBytes(n int) cu.DevicePtr {
	if be.scratchN < n {
		if be.scratch != 0 {
			be.check(be.stream.Synchronize(), "scratch")
			be.check(cu.MemFree(be.scratch), "scratch")
		}
		size := max(n, 2*be.scratchN, 1<<16)
		var err error
		be.scratch, err = cu.MemAlloc(int64(size))
		be.check(err, "scratch")
		be.scratchN = size
	}
	return be.scratch
}

// toDevice copies n bytes from host memory through the pinned staging
// and waits (the source may be reused once it returns).
func (be *cudaBackend) toDevice(dst uint64, src unsafe.Pointer, n int) {
	if n == 0 {
		return
	}
	defer be.enter()()
	be.mu.Lock()
	defer be.mu.Unlock()
	st := be.staging(n)
	copy(unsafe.Slice((*byte)(st), n), unsafe.Slice((*byte)(src), n))
	be.check(cu.MemcpyHtoDAsync(cu.DevicePtr(dst), st, int64(n), be.stream), "copy to the device")
	be.check(be.stream.Synchronize(), "copy to the device")
}

// toHost waits for the stream, then copies n bytes to host memory.
func (be *cudaBackend) toHost(dst unsafe.Pointer, src uint64, n int) {
	if n == 0 {
		return
	}
	defer be.enter()()
	be.mu.Lock()
	defer be.mu.Unlock()
	st := be.staging(n)
	be.check(cu.MemcpyDtoHAsync(st, cu.DevicePtr(src), int64(n), be.stream), "copy to the host")
	be.check(be.stream.Synchronize(), "copy to the host")
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(st), n))
}

func (be *cudaBackend) FromHost(dst Buffer, src []float32) {
	mustLen(dst.n, len(src))
	if len(src) > 0 {
		be.toDevice(be.p(dst), unsafe.Pointer(&src[0]), 4*len(src))
	}
}

func (be *cudaBackend) ToHost(dst []float32, src Buffer) {
	mustLen(len(dst), src.n)
	if len(dst) > 0 {
		be.toHost(unsafe.Pointer(&dst[0]), be.p(src), 4*len(dst))
	}
}

func (be *cudaBackend) IntsFromHost(dst Ints, src []int32) {
	mustLen(dst.n, len(src))
	if len(src) > 0 {
		be.toDevice(be.pi(dst), unsafe.Pointer(&src[0]), 4*len(src))
	}
}

func (be *cudaBackend) IntsToHost(dst []int32, src Ints) {
	mustLen(len(dst), src.n)
	if len(dst) > 0 {
		be.toHost(unsafe.Pointer(&dst[0]), be.pi(src), 4*len(dst))
	}
}

func (be *cudaBackend) Zero(b Buffer) {
	if b.n == 0 {
		return
	}
	defer be.enter()()
	be.check(cu.MemsetD32Async(cu.DevicePtr(be.p(b)), 0, int64(b.n), be.stream), "zero")
}

// addr is a buffer's device address and device, on any device (Copy and
// Accumulate take another device's buffers: the all-reduce's).
func (be *cudaBackend) addr(b Buffer) (cu.DevicePtr, *cudaDevice) {
	m := be.mem(b.mem)
	return m.ptr + cu.DevicePtr(4*b.off), m.be.d
}

func (be *cudaBackend) Copy(dst, src Buffer) {
	mustLen(dst.n, src.n)
	if dst.n == 0 {
		return
	}
	defer be.enter()()
	dp, dd := be.addr(dst)
	sp, sd := be.addr(src)
	if dd == sd {
		be.check(cu.MemcpyDtoDAsync(dp, sp, int64(4*dst.n), be.stream), "copy")
		return
	}
	be.check(cu.MemcpyPeerAsync(dp, dd.ctx, sp, sd.ctx, int64(4*dst.n), be.stream), "copy between devices")
}

func (be *cudaBackend) Accumulate(dst, src Buffer) {
	mustLen(dst.n, src.n)
	if dst.n == 0 {
		return
	}
	sp, sd := be.addr(src)
	if sd != be.d { // another device's values: copied here once, then added
		defer be.enter()()
		be.mu.Lock()
		defer be.mu.Unlock()
		tmp := be.scratchBytes(4 * src.n)
		be.check(cu.MemcpyPeerAsync(tmp, be.d.ctx, sp, sd.ctx, int64(4*src.n), be.stream), "copy between devices")
		be.launch("accumulate_k", cudakern.Elementwise(dst.n), be.p(dst), uint64(tmp), i64(dst.n))
		be.check(be.stream.Synchronize(), "accumulate") // the scratch is reused
		return
	}
	defer be.enter()()
	be.launch("accumulate_k", cudakern.Elementwise(dst.n), be.p(dst), be.p(src), i64(dst.n))
}

func (be *cudaBackend) Scale(b Buffer, f float32) {
	defer be.enter()()
	be.launch("scale_k", cudakern.Elementwise(b.n), be.p(b), i64(b.n), f64(float64(f)))
}

func (be *cudaBackend) Add(out, a, b Buffer) {
	defer be.enter()()
	be.launch("add_k", cudakern.Elementwise(out.n), be.p(out), be.p(a), be.p(b), i64(out.n))
}

func (be *cudaBackend) Embedding(out Buffer, tokens Ints, table Buffer, N, D int) {
	defer be.enter()()
	be.launch("embedding_k", cudakern.Elementwise(N*D), be.p(out), be.pi(tokens), be.p(table), i64(N), i64(D))
}

func (be *cudaBackend) EmbeddingBackward(dtable Buffer, tokens Ints, dout Buffer, N, D int) {
	defer be.enter()()
	be.launch("embedding_backward_k", cudakern.Elementwise(N*D), be.p(dtable), be.pi(tokens), be.p(dout), i64(N), i64(D))
}

func (be *cudaBackend) AddPositions(x, wpe Buffer, N, T, D int) {
	defer be.enter()()
	be.launch("add_positions_k", cudakern.Elementwise(N*D), be.p(x), be.p(wpe), i64(N), i64(T), i64(D))
}

func (be *cudaBackend) PositionsBackward(dwpe, dx Buffer, N, T, D int) {
	defer be.enter()()
	be.launch("positions_backward_k", cudakern.Elementwise(T*D), be.p(dwpe), be.p(dx), i64(N), i64(T), i64(D))
}

func (be *cudaBackend) RMSNorm(out, rstd, x, weight Buffer, N, D int) {
	defer be.enter()()
	be.launch("rmsnorm_k", cudakern.Rows(N), be.p(out), be.p(rstd), be.p(x), be.p(weight), i64(N), i64(D), f64(RMSNormEps))
}

func (be *cudaBackend) RMSNormBackward(dx, dweight, dout, x, weight, rstd Buffer, N, D int) {
	defer be.enter()()
	be.launch("rmsnorm_backward_dx_k", cudakern.Rows(N), be.p(dx), be.p(dout), be.p(x), be.p(weight), be.p(rstd), i64(N), i64(D))
	be.launch("rmsnorm_backward_dw_k", cudakern.Elementwise(D), be.p(dweight), be.p(dout), be.p(x), be.p(rstd), i64(N), i64(D))
}

// gemm runs the row-major product C = alpha op(A) op(B) + beta C of plan g
// (a cudakern.RowMajor plan: cuBLAS's A is the row-major B).
func (be *cudaBackend) gemm(g cudakern.Gemm, alpha float32, a, b uint64, beta float32, c uint64) {
	be.check(be.blas.Sgemm(g, alpha, uintptr(b), uintptr(a), beta, uintptr(c)), "sgemm")
}

func (be *cudaBackend) gemmBatched(g cudakern.Gemm, alpha float32, a uint64, sa int, b uint64, sb int, beta float32, c uint64, sc, count int) {
	be.check(be.blas.SgemmBatched(g, alpha, uintptr(b), sb, uintptr(a), sa, beta, uintptr(c), sc, count), "sgemm batched")
}

func (be *cudaBackend) MatMul(out, in, w, bias Buffer, N, In, Out int) {
	defer be.enter()()
	be.gemm(cudakern.Linear(N, In, Out), 1, be.p(in), be.p(w), 0, be.p(out))
	if !bias.IsNil() {
		be.launch("bias_add_k", cudakern.Elementwise(N*Out), be.p(out), be.p(bias), i64(N), i64(Out))
	}
}

func (be *cudaBackend) MatMulBackward(din, dw, dbias, dout, in, w Buffer, N, In, Out int) {
	defer be.enter()()
	if !din.IsNil() {
		be.gemm(cudakern.LinearDIn(N, In, Out), 1, be.p(dout), be.p(w), 1, be.p(din))
	}
	be.gemm(cudakern.LinearDW(N, In, Out), 1, be.p(dout), be.p(in), 1, be.p(dw))
	if !dbias.IsNil() {
		be.launch("bias_backward_k", cudakern.Elementwise(Out), be.p(dbias), be.p(dout), i64(N), i64(Out))
	}
}

func (be *cudaBackend) MatMulBackwardInput(din, dout, w Buffer, N, In, Out int) {
	defer be.enter()()
	be.gemm(cudakern.LinearDIn(N, In, Out), 1, be.p(dout), be.p(w), 1, be.p(din))
}

func (be *cudaBackend) SwiGLU(out, h Buffer, N, H int) {
	defer be.enter()()
	be.launch("swiglu_k", cudakern.Elementwise(N*H), be.p(out), be.p(h), i64(N), i64(H))
}

func (be *cudaBackend) SwiGLUBackward(dh, dout, h Buffer, N, H int) {
	defer be.enter()()
	be.launch("swiglu_backward_k", cudakern.Elementwise(N*H), be.p(dh), be.p(dout), be.p(h), i64(N), i64(H))
}

// Attention is the CPU's per-(batch, head) products, each batch's heads
// one strided batched GEMM (heads are hs apart in qkv and out, T*T in
// att), with the softmax between them in one launch.
func (be *cudaBackend) Attention(out, att, qkv Buffer, B, T, C, NH int, causal bool) {
	defer be.enter()()
	hs := C / NH
	scale := float32(1 / math.Sqrt(float64(hs)))
	q0, a0, o0 := be.p(qkv), be.p(att), be.p(out)
	for b := 0; b < B; b++ {
		q := q0 + uint64(4*b*T*3*C)
		k, a := q+uint64(4*C), a0+uint64(4*b*NH*T*T)
		be.gemmBatched(cudakern.Scores(T, C, hs), scale, q, hs, k, hs, 0, a, T*T, NH)
	}
	be.launch("attention_softmax_k", cudakern.WarpRows(B*NH*T), a0, i64(B*NH*T), i64(T), flag(causal))
	for b := 0; b < B; b++ {
		v := q0 + uint64(4*(b*T*3*C+2*C))
		a, o := a0+uint64(4*b*NH*T*T), o0+uint64(4*b*T*C)
		be.gemmBatched(cudakern.Weighted(T, C, hs), 1, a, T*T, v, hs, 0, o, hs, NH)
	}
}

func (be *cudaBackend) AttentionBackward(dqkv, dout, qkv, att, scratch Buffer, B, T, C, NH int, causal bool) {
	defer be.enter()()
	hs := C / NH
	scale := 1 / math.Sqrt(float64(hs))
	q0, d0, a0, s0, o0 := be.p(qkv), be.p(dqkv), be.p(att), be.p(scratch), be.p(dout)
	for b := 0; b < B; b++ {
		base := uint64(4 * b * T * 3 * C)
		v, dv := q0+base+uint64(8*C), d0+base+uint64(8*C)
		p, ds, do := a0+uint64(4*b*NH*T*T), s0+uint64(4*b*NH*T*T), o0+uint64(4*b*T*C)
		be.gemmBatched(cudakern.DV(T, C, hs), 1, p, T*T, do, hs, 1, dv, hs, NH)
		be.gemmBatched(cudakern.DP(T, C, hs), 1, do, hs, v, hs, 0, ds, T*T, NH)
	}
	be.launch("attention_softmax_backward_k", cudakern.WarpRows(B*NH*T), s0, a0, i64(B*NH*T), i64(T), flag(causal), f64(scale))
	for b := 0; b < B; b++ {
		base := uint64(4 * b * T * 3 * C)
		q, k := q0+base, q0+base+uint64(4*C)
		dq, dk := d0+base, d0+base+uint64(4*C)
		ds := s0 + uint64(4*b*NH*T*T)
		be.gemmBatched(cudakern.DQ(T, C, hs), 1, ds, T*T, k, hs, 1, dq, hs, NH)
		be.gemmBatched(cudakern.DK(T, C, hs), 1, ds, T*T, q, hs, 1, dk, hs, NH)
	}
}

// CrossEntropy: the softmax and each row's loss and weight on the
// device; the 2N float64s cross once and are added on the host in row
// order, as the CPU does.
func (be *cudaBackend) CrossEntropy(probs, logits Buffer, targets Ints, weights Buffer, N, V int) float64 {
	defer be.enter()()
	be.launch("softmax_rows_k", cudakern.Rows(N), be.p(probs), be.p(logits), i64(N), i64(V))
	be.mu.Lock()
	defer be.mu.Unlock()
	s := be.scratchBytes(16 * N)
	be.launch("ce_loss_rows_k", cudakern.Elementwise(N), uint64(s), uint64(s)+uint64(8*N), be.p(probs), be.pi(targets), be.p(weights), i64(N), i64(V))
	st := be.staging(16 * N)
	be.check(cu.MemcpyDtoHAsync(st, s, int64(16*N), be.stream), "loss")
	be.check(be.stream.Synchronize(), "loss")
	rows := unsafe.Slice((*float64)(st), 2*N)
	var loss, wsum float64
	for n := 0; n < N; n++ {
		loss += rows[n]
		wsum += rows[N+n]
	}
	if wsum == 0 {
		return 0
	}
	return loss / wsum
}

func (be *cudaBackend) CrossEntropyBackward(dlogits, probs Buffer, targets Ints, weights Buffer, N, V int) {
	defer be.enter()()
	be.mu.Lock()
	defer be.mu.Unlock()
	s := be.scratchBytes(8)
	be.launch("ce_wsum_k", cudakern.Launch{Grid: 1, Block: cudakern.Block}, uint64(s), be.pi(targets), be.p(weights), i64(N))
	be.launch("ce_backward_k", cudakern.Rows(N), be.p(dlogits), be.p(probs), be.pi(targets), be.p(weights), uint64(s), i64(N), i64(V))
	be.check(be.stream.Synchronize(), "cross-entropy") // the scratch is reused
}

func (be *cudaBackend) ArgmaxRows(out Ints, x Buffer, N, V int) {
	defer be.enter()()
	be.launch("argmax_rows_k", cudakern.Rows(N), be.pi(out), be.p(x), i64(N), i64(V))
}

func (be *cudaBackend) BlockInput(x0 Buffer, anchors Ints, wte, mask, wpe Buffer, S, P, D int) {
	defer be.enter()()
	be.launch("block_input_k", cudakern.Elementwise(S*P*D), be.p(x0), be.pi(anchors), be.p(wte), be.p(mask), be.p(wpe), i64(S), i64(P), i64(D))
}

func (be *cudaBackend) BlockInputBackward(dwpe, dmask, dx Buffer, S, P, D int) {
	defer be.enter()()
	be.launch("block_input_dwpe_k", cudakern.Elementwise(P*D), be.p(dwpe), be.p(dx), i64(S), i64(P), i64(D))
	be.launch("block_input_dmask_k", cudakern.Elementwise(D), be.p(dmask), be.p(dx), i64(S), i64(P), i64(D))
}

func (be *cudaBackend) AddContext(out, x, ctx Buffer, N, P, D int) {
	defer be.enter()()
	be.launch("add_context_k", cudakern.Elementwise(N*D), be.p(out), be.p(x), be.p(ctx), i64(N), i64(P), i64(D))
}

func (be *cudaBackend) ContextBackward(dctx, dout Buffer, N, P, D int) {
	defer be.enter()()
	be.launch("context_backward_k", cudakern.Elementwise((N+P-1)/P*D), be.p(dctx), be.p(dout), i64(N), i64(P), i64(D))
}

func (be *cudaBackend) SumSquares(b Buffer) float64 {
	defer be.enter()()
	be.mu.Lock()
	defer be.mu.Unlock()
	g := cudakern.SumGrid(b.n)
	s := be.scratchBytes(8 * g)
	be.launch("sum_squares_k", cudakern.Launch{Grid: g, Block: cudakern.Block}, uint64(s), be.p(b), i64(b.n))
	st := be.staging(8 * g)
	be.check(cu.MemcpyDtoHAsync(st, s, int64(8*g), be.stream), "sum of squares")
	be.check(be.stream.Synchronize(), "sum of squares")
	var sum float64
	for _, x := range unsafe.Slice((*float64)(st), g) {
		sum += x
	}
	return sum
}

func (be *cudaBackend) AdamW(params, grads, m, v, decay Buffer, s AdamWStep) {
	defer be.enter()()
	be.launch("adamw_k", cudakern.Elementwise(params.n), be.p(params), be.p(grads), be.p(m), be.p(v), be.p(decay), i64(params.n),
		f64(float64(s.LR)), f64(float64(s.Beta1)), f64(float64(s.Beta2)), f64(float64(s.Eps)), f64(float64(s.WeightDecay)),
		f64(float64(s.Scale)), f64(float64(s.BC1)), f64(float64(s.BC2)))
}
