//go:build cuda

// Package cudalib reaches NVRTC and cuBLAS through dlopen, by their
// unversioned entry points, so that one cuda build of dflow runs with the
// CUDA runtime libraries of the machine it runs on (11.x, 12.x or 13.x):
// gorgonia.org/cu/nvrtc and gorgonia.org/cu/blas link libnvrtc and
// libcublas at build time, and their symbols are versioned
// (cublasSgemm_v2@libcublas.so.11), so a binary linked against CUDA
// 11.8's stubs would not start against CUDA 13's libraries. cuBLAS here
// also binds a handle to a stream (cublasSetStream), which cu/blas
// v0.9.6 cannot, and has the strided batched GEMM attention uses.
//
// The driver API (contexts, streams, memory, modules, launches) is
// gorgonia.org/cu's, in internal/nn. This package imports neither cu nor
// any CUDA header, so its NVRTC path is tested on machines without a GPU.
package cudalib

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

static void* lib_nvrtc;
static void* lib_cublas;

static void* open_first(const char* const* names, int n) {
	for (int i = 0; i < n; i++) {
		void* h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
		if (h) return h;
	}
	return NULL;
}

static const char* const nvrtc_names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"};
static const char* const cublas_names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"};

typedef int (*nvrtcVersion_t)(int*, int*);
typedef int (*nvrtcCreateProgram_t)(void**, const char*, const char*, int, const char* const*, const char* const*);
typedef int (*nvrtcCompileProgram_t)(void*, int, const char* const*);
typedef int (*nvrtcGetSize_t)(void*, size_t*);
typedef int (*nvrtcGet_t)(void*, char*);
typedef int (*nvrtcDestroyProgram_t)(void**);
typedef const char* (*nvrtcGetErrorString_t)(int);

static nvrtcVersion_t p_nvrtcVersion;
static nvrtcCreateProgram_t p_nvrtcCreateProgram;
static nvrtcCompileProgram_t p_nvrtcCompileProgram;
static nvrtcGetSize_t p_nvrtcGetPTXSize, p_nvrtcGetProgramLogSize;
static nvrtcGet_t p_nvrtcGetPTX, p_nvrtcGetProgramLog;
static nvrtcDestroyProgram_t p_nvrtcDestroyProgram;
static nvrtcGetErrorString_t p_nvrtcGetErrorString;

// load_nvrtc returns NULL, or a message.
static const char* load_nvrtc(void) {
	if (lib_nvrtc) return NULL;
	void* h = open_first(nvrtc_names, 4);
	if (!h) return "none of libnvrtc.so.13, .12, .11.2 or libnvrtc.so could be loaded";
	p_nvrtcVersion = (nvrtcVersion_t)dlsym(h, "nvrtcVersion");
	p_nvrtcCreateProgram = (nvrtcCreateProgram_t)dlsym(h, "nvrtcCreateProgram");
	p_nvrtcCompileProgram = (nvrtcCompileProgram_t)dlsym(h, "nvrtcCompileProgram");
	p_nvrtcGetPTXSize = (nvrtcGetSize_t)dlsym(h, "nvrtcGetPTXSize");
	p_nvrtcGetPTX = (nvrtcGet_t)dlsym(h, "nvrtcGetPTX");
	p_nvrtcGetProgramLogSize = (nvrtcGetSize_t)dlsym(h, "nvrtcGetProgramLogSize");
	p_nvrtcGetProgramLog = (nvrtcGet_t)dlsym(h, "nvrtcGetProgramLog");
	p_nvrtcDestroyProgram = (nvrtcDestroyProgram_t)dlsym(h, "nvrtcDestroyProgram");
	p_nvrtcGetErrorString = (nvrtcGetErrorString_t)dlsym(h, "nvrtcGetErrorString");
	if (!p_nvrtcVersion || !p_nvrtcCreateProgram || !p_nvrtcCompileProgram || !p_nvrtcGetPTXSize || !p_nvrtcGetPTX ||
		!p_nvrtcGetProgramLogSize || !p_nvrtcGetProgramLog || !p_nvrtcDestroyProgram || !p_nvrtcGetErrorString)
		return "libnvrtc lacks an entry point dflow needs";
	lib_nvrtc = h;
	return NULL;
}

static int nvrtc_version(int* maj, int* min) { return p_nvrtcVersion(maj, min); }
static const char* nvrtc_error(int r) { return p_nvrtcGetErrorString(r); }

// nvrtc_compile compiles src; *ptx and *log are malloc'd (free them).
static int nvrtc_compile(const char* src, const char* name, int nopt, const char* const* opts, char** ptx, char** log) {
	void* prog = NULL;
	*ptx = NULL;
	*log = NULL;
	int r = p_nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
	if (r) return r;
	int cr = p_nvrtcCompileProgram(prog, nopt, opts);
	size_t n = 0;
	if (!p_nvrtcGetProgramLogSize(prog, &n) && n > 0) {
		*log = (char*)malloc(n + 1);
		p_nvrtcGetProgramLog(prog, *log);
		(*log)[n] = 0;
	}
	if (!cr && !(r = p_nvrtcGetPTXSize(prog, &n))) {
		*ptx = (char*)malloc(n + 1);
		r = p_nvrtcGetPTX(prog, *ptx);
		(*ptx)[n] = 0;
	}
	p_nvrtcDestroyProgram(&prog);
	return cr ? cr : r;
}

typedef int (*cublasCreate_t)(void**);
typedef int (*cublasDestroy_t)(void*);
typedef int (*cublasSetStream_t)(void*, void*);
typedef int (*cublasSgemm_t)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int, const float*, float*, int);
typedef int (*cublasSgemmStridedBatched_t)(void*, int, int, int, int, int, const float*, const float*, int, long long, const float*, int, long long, const float*, float*, int, long long, int);

static cublasCreate_t p_cublasCreate;
static cublasDestroy_t p_cublasDestroy;
static cublasSetStream_t p_cublasSetStream;
static cublasSgemm_t p_cublasSgemm;
static cublasSgemmStridedBatched_t p_cublasSgemmStridedBatched;

static const char* load_cublas(void) {
	if (lib_cublas) return NULL;
	void* h = open_first(cublas_names, 4);
	if (!h) return "none of libcublas.so.13, .12, .11 or libcublas.so could be loaded";
	p_cublasCreate = (cublasCreate_t)dlsym(h, "cublasCreate_v2");
	p_cublasDestroy = (cublasDestroy_t)dlsym(h, "cublasDestroy_v2");
	p_cublasSetStream = (cublasSetStream_t)dlsym(h, "cublasSetStream_v2");
	p_cublasSgemm = (cublasSgemm_t)dlsym(h, "cublasSgemm_v2");
	p_cublasSgemmStridedBatched = (cublasSgemmStridedBatched_t)dlsym(h, "cublasSgemmStridedBatched");
	if (!p_cublasCreate || !p_cublasDestroy || !p_cublasSetStream || !p_cublasSgemm || !p_cublasSgemmStridedBatched)
		return "libcublas lacks an entry point dflow needs";
	lib_cublas = h;
	return NULL;
}

static int cublas_create(unsigned long long stream, unsigned long long* out) {
	void* h = NULL;
	int r = p_cublasCreate(&h);
	if (r) return r;
	r = p_cublasSetStream(h, (void*)stream);
	if (r) { p_cublasDestroy(h); return r; }
	*out = (unsigned long long)h;
	return 0;
}
static int cublas_destroy(unsigned long long h) { return p_cublasDestroy((void*)h); }

// cuBLAS's enums: CUBLAS_OP_N 0, CUBLAS_OP_T 1.
static int cublas_sgemm(unsigned long long h, int ta, int tb, int m, int n, int k, float alpha,
		unsigned long long a, int lda, unsigned long long b, int ldb, float beta, unsigned long long c, int ldc) {
	return p_cublasSgemm((void*)h, ta, tb, m, n, k, &alpha, (const float*)a, lda, (const float*)b, ldb, &beta, (float*)c, ldc);
}
static int cublas_sgemm_batched(unsigned long long h, int ta, int tb, int m, int n, int k, float alpha,
		unsigned long long a, int lda, long long sa, unsigned long long b, int ldb, long long sb, float beta,
		unsigned long long c, int ldc, long long sc, int count) {
	return p_cublasSgemmStridedBatched((void*)h, ta, tb, m, n, k, &alpha, (const float*)a, lda, sa, (const float*)b, ldb, sb,
		&beta, (float*)c, ldc, sc, count);
}
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/dflow-dev/dflow/internal/nn/cudakern"
)

// LoadNVRTC loads libnvrtc (once); its error says which names it tried.
func LoadNVRTC() error {
	if msg := C.load_nvrtc(); msg != nil {
		return fmt.Errorf("cuda: %s (NVRTC compiles dflow's kernels at start: install the CUDA runtime libraries, or put them on LD_LIBRARY_PATH)", C.GoString(msg))
	}
	return nil
}

// NVRTCVersion is the loaded NVRTC's version.
func NVRTCVersion() (major, minor int, err error) {
	if err := LoadNVRTC(); err != nil {
		return 0, 0, err
	}
	var ma, mi C.int
	if r := C.nvrtc_version(&ma, &mi); r != 0 {
		return 0, 0, fmt.Errorf("cuda: nvrtcVersion: %s", C.GoString(C.nvrtc_error(r)))
	}
	return int(ma), int(mi), nil
}

// Compile compiles CUDA C to PTX for a virtual architecture such as
// "compute_90". The log (warnings, or the errors) comes back either way.
func Compile(src, name, arch string, opts ...string) (ptx, log string, err error) {
	if err := LoadNVRTC(); err != nil {
		return "", "", err
	}
	all := append([]string{"--gpu-architecture=" + arch, "--std=c++14"}, opts...)
	copts := make([]*C.char, len(all))
	for i, o := range all {
		copts[i] = C.CString(o)
		defer C.free(unsafe.Pointer(copts[i]))
	}
	csrc, cname := C.CString(src), C.CString(name)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	var cptx, clog *C.char
	r := C.nvrtc_compile(csrc, cname, C.int(len(copts)), (**C.char)(unsafe.Pointer(&copts[0])), &cptx, &clog)
	if clog != nil {
		log = strings.TrimRight(C.GoString(clog), "\x00\n")
		C.free(unsafe.Pointer(clog))
	}
	if cptx != nil {
		ptx = C.GoString(cptx)
		C.free(unsafe.Pointer(cptx))
	}
	if r != 0 {
		return "", log, fmt.Errorf("cuda: NVRTC could not compile %s for %s: %s\n%s", name, arch, C.GoString(C.nvrtc_error(r)), log)
	}
	return ptx, log, nil
}

// CompileKernels compiles cudakern.Source for arch and checks that the
// PTX has an entry for every kernel of cudakern.Names.
func CompileKernels(arch string) (string, error) {
	ptx, _, err := Compile(cudakern.Source, "dflow_kernels.cu", arch) // no --use_fast_math: IEEE exp, sqrt and division
	if err != nil {
		return "", err
	}
	for _, n := range cudakern.Names {
		if !strings.Contains(ptx, ".entry "+n+"(") {
			return "", fmt.Errorf("cuda: the PTX for %s has no entry %s", arch, n)
		}
	}
	return ptx, nil
}

// LoadCUBLAS loads libcublas (once).
func LoadCUBLAS() error {
	if msg := C.load_cublas(); msg != nil {
		return fmt.Errorf("cuda: %s (cuBLAS runs dflow's matrix products: install the CUDA runtime libraries, or put them on LD_LIBRARY_PATH)", C.GoString(msg))
	}
	return nil
}

// Handle is a cuBLAS handle bound to one stream.
type Handle struct{ h C.ulonglong }

// NewHandle creates a handle for the current context, bound to stream (a
// CUstream's value; 0 is the default stream).
func NewHandle(stream uintptr) (Handle, error) {
	if err := LoadCUBLAS(); err != nil {
		return Handle{}, err
	}
	var h C.ulonglong
	if r := C.cublas_create(C.ulonglong(stream), &h); r != 0 {
		return Handle{}, fmt.Errorf("cuda: cublasCreate/cublasSetStream: status %d", int(r))
	}
	return Handle{h}, nil
}

// Close destroys the handle.
func (h Handle) Close() { C.cublas_destroy(h.h) }

func op(t bool) C.int {
	if t {
		return 1
	}
	return 0
}

// Sgemm runs one column-major product of the plan g on device pointers:
// a and b are the plan's A and B (for a RowMajor plan, the row-major
// product's B and A).
func (h Handle) Sgemm(g cudakern.Gemm, alpha float32, a, b uintptr, beta float32, c uintptr) error {
	if g.M == 0 || g.N == 0 {
		return nil
	}
	if r := C.cublas_sgemm(h.h, op(g.TransA), op(g.TransB), C.int(g.M), C.int(g.N), C.int(g.K), C.float(alpha),
		C.ulonglong(a), C.int(g.LDA), C.ulonglong(b), C.int(g.LDB), C.float(beta), C.ulonglong(c), C.int(g.LDC)); r != 0 {
		return fmt.Errorf("cuda: cublasSgemm %+v: status %d", g, int(r))
	}
	return nil
}

// SgemmBatched runs count products of the plan g, the i-th on a + i*sa,
// b + i*sb and c + i*sc (strides in floats).
func (h Handle) SgemmBatched(g cudakern.Gemm, alpha float32, a uintptr, sa int, b uintptr, sb int, beta float32, c uintptr, sc, count int) error {
	if g.M == 0 || g.N == 0 || count == 0 {
		return nil
	}
	if r := C.cublas_sgemm_batched(h.h, op(g.TransA), op(g.TransB), C.int(g.M), C.int(g.N), C.int(g.K), C.float(alpha),
		C.ulonglong(a), C.int(g.LDA), C.longlong(sa), C.ulonglong(b), C.int(g.LDB), C.longlong(sb), C.float(beta),
		C.ulonglong(c), C.int(g.LDC), C.longlong(sc), C.int(count)); r != 0 {
		return fmt.Errorf("cuda: cublasSgemmStridedBatched %+v x%d: status %d", g, count, int(r))
	}
	return nil
}
