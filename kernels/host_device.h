// BOULDER_HD: marks a function both host and device code call (empty outside nvcc).
#ifndef BOULDER_KERNELS_HOST_DEVICE_H_
#define BOULDER_KERNELS_HOST_DEVICE_H_

#ifdef __CUDACC__
#define BOULDER_HD __host__ __device__
#else
#define BOULDER_HD
#endif

#endif  // BOULDER_KERNELS_HOST_DEVICE_H_
