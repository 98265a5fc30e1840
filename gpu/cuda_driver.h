// cuda_driver.h -- the CUDA driver, opened with dlopen at first use (gpu/cuda_driver.cpp).
#pragma once

#include <string>

namespace dynamo::gpu {

// True if libcuda.so.1 can be opened; otherwise *why (if not null) says what happened.
bool cuda_driver_available(std::string *why);

}  // namespace dynamo::gpu
