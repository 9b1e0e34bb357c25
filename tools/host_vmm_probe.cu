// Probe: can host memory made by the CUDA virtual memory API (cuMemCreate at a HOST_NUMA
// location) be shared between processes by a file descriptor, and does a GPU gather from it
// run at the rate of managed memory kept in host memory rather than that of registered memory?
//
//   nvcc -O3 -arch=sm_90 -o host_vmm_probe tools/host_vmm_probe.cu -lcuda
//   ./host_vmm_probe GIB [GPUS]        (parent: every kind, then children import the VMM table)
//
// Each kind holds a table of GIB GiB of 512-byte rows filled with a known pattern; a kernel
// gathers 117,760 random rows (sorted, as the library's gather visits them) into GPU memory,
// 20 times; the row contents are checked. Prints one JSON line per measurement.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define CK(x) check_rt((x), #x, __LINE__)
#define CD(x) check_drv((x), #x, __LINE__)
static void check_rt(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) { fprintf(stderr, "line %d: %s: %s\n", line, what, cudaGetErrorString(e)); exit(1); }
}
static bool check_drv(CUresult e, const char* what, int line, bool fatal = true) {
  if (e != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorString(e, &s);
    fprintf(stderr, "line %d: %s: %s\n", line, what, s ? s : "?");
    if (fatal) exit(1);
    return false;
  }
  return true;
}

constexpr int kRowFloats = 128;  // 512 B rows
constexpr int kRows = 117760;
constexpr int kReps = 20;

__global__ void gather_kernel(const float4* __restrict__ table, const int64_t* __restrict__ rows, float4* out, int n) {
  constexpr int per_row = kRowFloats / 4;
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t total = (int64_t)n * per_row;
  for (; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / per_row, c = i % per_row;
    out[i] = table[rows[r] * per_row + c];
  }
}

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// row r, column c holds (float)(r * 7 + c) with r taken mod 2^20 (exact in float32); `p` holds
// rows [first, first + rows)
static void fill_host(float* p, size_t rows, size_t first = 0) {
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < (long long)rows; ++r)
    for (int c = 0; c < kRowFloats; ++c) p[r * kRowFloats + c] = (float)(((first + r) & 0xFFFFF) * 7 + c);
}

static sigjmp_buf g_fault;
static void on_fault(int) { siglongjmp(g_fault, 1); }

// Whether this process's CPU may read and write `p` (a fault is caught, not fatal).
static bool cpu_can_touch(volatile float* p) {
  struct sigaction sa = {}, old_segv, old_bus;
  sa.sa_handler = on_fault;
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  bool ok = false;
  if (sigsetjmp(g_fault, 1) == 0) {
    float x = p[0];
    p[0] = x;
    ok = true;
  }
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  return ok;
}

static std::vector<int64_t> pick_rows(size_t table_rows, unsigned seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> r(kRows);
  for (auto& x : r) x = (int64_t)(g() % table_rows);
  std::sort(r.begin(), r.end());
  return r;
}

// Gathers from `table` on the current device; prints GB/s and checks the rows.
static void measure(const char* kind, const void* table, size_t table_rows, int device, double setup_s) {
  CK(cudaSetDevice(device));
  auto rows = pick_rows(table_rows, 1234 + device);
  int64_t* d_rows;
  float4* d_out;
  CK(cudaMalloc(&d_rows, kRows * sizeof(int64_t)));
  CK(cudaMalloc(&d_out, (size_t)kRows * kRowFloats * 4));
  CK(cudaMemcpy(d_rows, rows.data(), kRows * sizeof(int64_t), cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  gather_kernel<<<sms * 8, 256>>>((const float4*)table, d_rows, d_out, kRows);  // warm-up
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(kReps);
  for (int i = 0; i < kReps; ++i) {
    CK(cudaMemset(d_out, 0xFF, (size_t)kRows * kRowFloats * 4));  // poisoned
    CK(cudaEventRecord(a));
    gather_kernel<<<sms * 8, 256>>>((const float4*)table, d_rows, d_out, kRows);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    CK(cudaEventElapsedTime(&ms[i], a, b));
  }
  std::vector<float> host((size_t)kRows * kRowFloats);
  CK(cudaMemcpy(host.data(), d_out, host.size() * 4, cudaMemcpyDeviceToHost));
  long bad = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kRowFloats; ++c)
      bad += host[(size_t)r * kRowFloats + c] != (float)((rows[r] & 0xFFFFF) * 7 + c);
  std::sort(ms.begin(), ms.end());
  double gbs = (double)kRows * kRowFloats * 4 / (ms[kReps / 2] * 1e-3) / 1e9;
  printf("{\"kind\": \"%s\", \"device\": %d, \"pid\": %d, \"table_gib\": %.1f, \"gather_gbs_p50\": %.1f, "
         "\"gather_ms_p50\": %.3f, \"gather_ms_min\": %.3f, \"gather_ms_max\": %.3f, \"wrong_values\": %ld, \"setup_s\": %.2f}\n",
         kind, device, (int)getpid(), table_rows * 512.0 / (1 << 30), gbs, ms[kReps / 2], ms[0], ms[kReps - 1], bad, setup_s);
  fflush(stdout);
  CK(cudaFree(d_rows));
  CK(cudaFree(d_out));
}

static void pinned_ceiling(int device) {
  CK(cudaSetDevice(device));
  size_t n = 1ull << 30;
  void *h, *d;
  CK(cudaMallocHost(&h, n));
  CK(cudaMalloc(&d, n));
  memset(h, 1, n);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  CK(cudaEventRecord(a));
  for (int i = 0; i < 5; ++i) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  printf("{\"kind\": \"pinned_memcpy\", \"device\": %d, \"gbs\": %.1f}\n", device, 5.0 * n / (ms * 1e-3) / 1e9);
  fflush(stdout);
  CK(cudaFreeHost(h));
  CK(cudaFree(d));
}

struct Vmm {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;
  size_t size = 0;
};

// Maps `handle` (size bytes) for every GPU in [0, gpus) and the CPU.
static bool map_all(Vmm& v, int gpus, size_t align) {
  if (!check_drv(cuMemAddressReserve(&v.ptr, v.size, align, 0, 0), "cuMemAddressReserve", __LINE__, false)) return false;
  if (!check_drv(cuMemMap(v.ptr, v.size, 0, v.handle, 0), "cuMemMap", __LINE__, false)) return false;
  std::vector<CUmemAccessDesc> desc(gpus + 1);
  for (int g = 0; g < gpus; ++g) {
    desc[g].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[g].location.id = g;
    desc[g].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  desc[gpus].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  desc[gpus].location.id = 0;
  desc[gpus].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!check_drv(cuMemSetAccess(v.ptr, v.size, desc.data(), gpus + 1), "cuMemSetAccess(gpus + host)", __LINE__, false)) {
    fprintf(stderr, "  retrying without host access\n");
    return check_drv(cuMemSetAccess(v.ptr, v.size, desc.data(), gpus), "cuMemSetAccess(gpus)", __LINE__, false);
  }
  return true;
}

static int child(int fd, size_t bytes, int device, int gpus) {
  CK(cudaSetDevice(device));
  CK(cudaFree(0));
  double t0 = now();
  Vmm v;
  v.size = bytes;
  CD(cuMemImportFromShareableHandle(&v.handle, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  if (!map_all(v, gpus, 1 << 21)) return 1;
  measure("vmm_host_numa_imported", (const void*)v.ptr, bytes / 512, device, now() - t0);
  CD(cuMemUnmap(v.ptr, v.size));
  CD(cuMemAddressFree(v.ptr, v.size));
  CD(cuMemRelease(v.handle));
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--child")
    return child(atoi(argv[2]), strtoull(argv[3], nullptr, 10), atoi(argv[4]), atoi(argv[5]));
  double gib = argc > 1 ? atof(argv[1]) : 16.0;
  int gpus_avail = 0;
  CK(cudaGetDeviceCount(&gpus_avail));
  int gpus = argc > 2 ? std::min(atoi(argv[2]), gpus_avail) : 1;
  size_t bytes = (size_t)(gib * (1 << 30));
  bytes = bytes / (2 << 20) * (2 << 20);
  size_t rows = bytes / 512;
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  CUdevice dev;
  CD(cuDeviceGet(&dev, 0));
  int vmm = 0, fd_ok = 0, numa_vmm = 0, numa_id = -2;
  CD(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  CD(cuDeviceGetAttribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  cuDeviceGetAttribute(&numa_vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  cuDeviceGetAttribute(&numa_id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
  printf("{\"attributes\": {\"vmm\": %d, \"posix_fd\": %d, \"host_numa_vmm\": %d, \"host_numa_id\": %d}, \"gpus\": %d}\n",
         vmm, fd_ok, numa_vmm, numa_id, gpus);
  fflush(stdout);
  for (int g = 0; g < gpus; ++g) pinned_ceiling(g);

  // 1. VMM host memory, shareable by a file descriptor.
  {
    double t0 = now();
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = numa_id >= 0 ? numa_id : 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    bool ok = check_drv(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                        "granularity", __LINE__, false);
    printf("{\"vmm_granularity\": %zu}\n", gran);
    Vmm v;
    v.size = gran ? (bytes + gran - 1) / gran * gran : bytes;
    ok = ok && check_drv(cuMemCreate(&v.handle, v.size, &prop, 0), "cuMemCreate(HOST_NUMA, posix fd)", __LINE__, false);
    ok = ok && map_all(v, gpus, std::max<size_t>(gran, 1 << 21));
    if (ok) {
      double t_alloc = now() - t0;
      double t1 = now();
      // The CPU fills the mapping where it may; else a copy from pinned staging.
      bool cpu_fill = true;
      float* p = (float*)v.ptr;
      CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MAPPED;
      int mapped = 0;
      cuPointerGetAttribute(&mapped, attr, v.ptr);
      printf("{\"vmm_alloc_s\": %.2f, \"mapped_attr\": %d}\n", t_alloc, mapped);
      fflush(stdout);
      cpu_fill = cpu_can_touch(p);
      printf("{\"vmm_cpu_access\": %s}\n", cpu_fill ? "true" : "false");
      fflush(stdout);
      if (cpu_fill) {
        fill_host(p, rows);
      } else {
        size_t chunk = 1ull << 28;
        float* staging;
        CK(cudaMallocHost(&staging, chunk));
        for (size_t off = 0; off < rows * 512; off += chunk) {
          size_t n = std::min(chunk, rows * 512 - off);
          fill_host(staging, n / 512, off / 512);
          CK(cudaMemcpy((char*)v.ptr + off, staging, n, cudaMemcpyDefault));
        }
        CK(cudaFreeHost(staging));
      }
      double t_fill = now() - t1;
      printf("{\"vmm_fill_s\": %.2f, \"fill_gbs\": %.1f}\n", t_fill, bytes / t_fill / 1e9);
      for (int g = 0; g < gpus; ++g) measure("vmm_host_numa", (const void*)v.ptr, rows, g, t_alloc);
      int fd = -1;
      if (check_drv(cuMemExportToShareableHandle(&fd, v.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                    "export fd", __LINE__, false)) {
        fcntl(fd, F_SETFD, 0);
        // One child per GPU, all at once: each imports the table and gathers on its GPU.
        std::vector<pid_t> kids;
        for (int g = 0; g < gpus; ++g) {
          pid_t pid = fork();
          if (pid == 0) {
            std::string a = std::to_string(fd), b = std::to_string(v.size), c = std::to_string(g),
                        d = std::to_string(gpus);
            execl("/proc/self/exe", argv[0], "--child", a.c_str(), b.c_str(), c.c_str(), d.c_str(), (char*)nullptr);
            _exit(127);
          }
          kids.push_back(pid);
        }
        for (pid_t k : kids) {
          int s = 0;
          waitpid(k, &s, 0);
          if (!WIFEXITED(s) || WEXITSTATUS(s) != 0) printf("{\"child_failed\": %d}\n", s);
        }
        close(fd);
      }
      CD(cuMemUnmap(v.ptr, v.size));
      CD(cuMemAddressFree(v.ptr, v.size));
      CD(cuMemRelease(v.handle));
    } else {
      printf("{\"vmm_host_numa\": \"unsupported\"}\n");
    }
    fflush(stdout);
  }

  // 2. Managed memory kept in host memory, read by each GPU in place.
  {
    double t0 = now();
    float* p;
    CK(cudaMallocManaged(&p, bytes));
    cudaMemLocation host = {};
    host.type = cudaMemLocationTypeHost;
    CK(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, host));
    for (int g = 0; g < gpus; ++g) {
      cudaMemLocation d = {};
      d.type = cudaMemLocationTypeDevice;
      d.id = g;
      CK(cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, d));
    }
    fill_host(p, rows);
    double t = now() - t0;
    for (int g = 0; g < gpus; ++g) measure("managed_host", p, rows, g, t);
    CK(cudaFree(p));
  }

  // 3. Ordinary host memory registered with CUDA (what a shared-memory table is today).
  {
    double t0 = now();
    float* p = (float*)aligned_alloc(1 << 21, bytes);
    fill_host(p, rows);
    CK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    double t = now() - t0;
    for (int g = 0; g < gpus; ++g) measure("registered_malloc", p, rows, g, t);
    CK(cudaHostUnregister(p));
    free(p);
  }
  return 0;
}
