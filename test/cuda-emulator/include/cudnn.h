// cuDNN as the emulator provides it: the legacy (descriptor based) convolution API of cuDNN 9 that
// the CUDA backend uses, with the types, enumerators and numeric values of the cuDNN 9 headers.
//
// The emulator's behaviour (src/dnn.cc):
// - Every call validates its arguments when it is made and returns the documented status:
//   CUDNN_STATUS_BAD_PARAM for unset or inconsistent descriptors (data types that differ, input
//   channels that do not match the filter and group count, batch or output channels that do not
//   match, a dilated filter larger than the padded input), null alpha/beta, null or non-device
//   pointers or buffers smaller than their descriptor, a workspace smaller than the algorithm needs
//   or not device memory of the size given, and an algorithm value outside its enumeration;
//   CUDNN_STATUS_NOT_SUPPORTED for a data type / compute type configuration cuDNN does not
//   support, negative strides, NCHW_VECT_C layouts, and the algorithms the emulator does not
//   implement. Where the documentation of the three passes differs, so does the status: an output
//   of the wrong spatial size is NOT_SUPPORTED for the forward pass and BAD_PARAM for the backward
//   passes; output channels that are not a multiple of the group count are NOT_SUPPORTED for
//   backward data and BAD_PARAM otherwise. cudnnGetLastErrorString explains the last failure of
//   the calling thread.
// - The Find calls are blocking: on a capturing stream they return
//   CUDNN_STATUS_EXECUTION_FAILED_CUDART (the capture is left intact); otherwise they wait for the
//   stream, report the algorithms (those needing more workspace than given with
//   CUDNN_STATUS_ALLOC_FAILED, the others with CUDNN_STATUS_NOT_SUPPORTED, each with the
//   descriptor's math type), and overwrite the output buffer and the workspace they use with
//   rc_emu::kUninitializedByte, as the timed runs do.
// - The computations are queued on the handle's stream (rc_emu::enqueue) with the argument values
//   of the call (alpha and beta are read from host memory at the call); device memory is read and
//   written when the stream runs.
// - Data types: x, w and y FLOAT, HALF or BFLOAT16 with compute type FLOAT, HALF with compute type
//   HALF, DOUBLE with compute type DOUBLE. Products are accumulated in double precision. With FLOAT
//   data and math type CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH or
//   CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION the inputs are rounded to TF32 (10 mantissa bits, to
//   nearest, ties away from zero) as tensor cores do; CUDNN_FMA_MATH keeps them exact.
// - Emulated algorithms and their workspace (Cg = input channels per group, elem = 8 bytes for
//   DOUBLE compute, 4 otherwise):
//     forward         IMPLICIT_GEMM          0 bytes
//                     IMPLICIT_PRECOMP_GEMM  4 * outH * outW * R * S bytes (a table of input offsets)
//     backward data   ALGO_0                 0 bytes (reported non-deterministic)
//                     ALGO_1                 elem * H * W * C bytes (one image's accumulators)
//     backward filter ALGO_0                 0 bytes (reported non-deterministic)
//                     ALGO_1                 elem * ceil(N / 8) * K * R * S * Cg bytes (the partial
//                                            filter gradients of each group of 8 images)
//   The other algorithms are reported CUDNN_STATUS_NOT_SUPPORTED by the Find calls and refused by
//   the compute calls. The Find calls rank the algorithm with a workspace first.
// - cudnnConvolutionBiasActivationForward (src/dnn.cc): y = act(alpha1 * conv(x) + alpha2 * z
//   + bias), summed in double precision and rounded once to y's type, with the checks of cuDNN 9's
//   documentation (https://docs.nvidia.com/deeplearning/cudnn/backend/v9.6.0/api/cudnn-cnn-library.html,
//   cudnnConvolutionBiasActivationForward; cudnnActivationMode_t in the cudnn_graph library):
//   NOT_SUPPORTED for an activation other than RELU or IDENTITY, a reluNanOpt other than
//   CUDNN_NOT_PROPAGATE_NAN, IDENTITY with an algorithm other than IMPLICIT_PRECOMP_GEMM, a bias
//   that is not 1 x K x 1 x 1 with unit channel stride, a bias type other than the configuration's
//   (y's type for the FLOAT, DOUBLE, HALF and BFLOAT16 configurations), and z that does not match y
//   (dimensions, strides or type); BAD_PARAM for null descriptors or pointers and the convolution
//   checks of cudnnConvolutionForward. z is read only when alpha2 != 0; y may be z.
//
// The backend (graph) API, emulated for the descriptor types and attributes the CUDA backend's
// fused convolutions use (src/dnn_graph.cc), with the statuses of cuDNN 9's documentation
// (https://docs.nvidia.com/deeplearning/cudnn/backend/latest/api/cudnn-graph-library.html and
// https://docs.nvidia.com/deeplearning/cudnn/backend/latest/developer/graph-api.html):
// - Descriptors: TENSOR, CONVOLUTION, POINTWISE, OPERATION_CONVOLUTION_FORWARD,
//   OPERATION_CONVOLUTION_BACKWARD_DATA, OPERATION_CONVOLUTION_BACKWARD_FILTER, OPERATION_POINTWISE,
//   OPERATION_GEN_STATS, OPERATION_BN_BWD_WEIGHTS, OPERATIONGRAPH, ENGINEHEUR, ENGINECFG, ENGINE,
//   EXECUTION_PLAN and VARIANT_PACK; creating another type is CUDNN_STATUS_NOT_SUPPORTED.
// - cudnnBackendSetAttribute: CUDNN_STATUS_NOT_INITIALIZED on a finalized descriptor;
//   CUDNN_STATUS_BAD_PARAM for a null or destroyed descriptor, an attribute the type does not have, the wrong
//   attribute type, an element count outside the attribute's range, or a descriptor argument that
//   is not finalized or of the wrong type. cudnnBackendFinalize: BAD_PARAM for a missing required
//   attribute or inconsistent values (tensor dims and strides of different counts, a unique id
//   used twice in a graph, operand shapes that do not fit the operation); NOT_SUPPORTED for what
//   the emulator does not compute (pointwise modes other than ADD, MUL, RELU_FWD and RELU_BWD, convolutions
//   that are not 2-D cross-correlations on 4-D tensors, a graph with a cycle). cudnnBackendGetAttribute
//   on a descriptor that is not finalized: CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED.
// - Heuristics report one engine (global index 0) for every graph; its plan's workspace is the
//   size of the graph's virtual tensors, which it overwrites with rc_emu::kUninitializedByte.
// - cudnnBackendExecute checks the variant pack (every non-virtual tensor's unique id present,
//   each pointer device memory of the tensor's extent) and queues the graph on the handle's stream.
//   The graph is interpreted node by node in dependency order over double-precision values, every
//   tensor's values (virtual ones too) rounded to its data type. Pointwise operands broadcast
//   along dimensions of size 1; GEN_STATS writes the per-channel (dimension 1) sum and sum of
//   squares of its input over all other dimensions; convolutions (forward, backward data: dx from
//   dy and w, backward filter: dw from x and dy) sum products in double precision. RELU_BWD
//   (XDESC the forward input, DYDESC the incoming gradient, DXDESC the output) passes dy where
//   x > 0 and writes 0 elsewhere. BN_BWD_WEIGHTS takes x, dy [N,C,H,W] and the per-channel mean,
//   inverse std and scale (gamma) [1,C,1,1] and writes, per channel over the M = N*H*W others,
//   dScale = sum(dy * (x - mean) * invStd), dBias = sum(dy) and the coefficients of the batch
//   norm's input gradient dx = eqDy * dy + eqX * x + eqBias: eqDy = scale * invStd,
//   eqX = -scale * invStd^3 * sum(dy * (x - mean)) / M, eqBias = -eqX * mean - eqDy * dBias / M
//   (all FLOAT [1,C,1,1]).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// The emulator reports itself as cuDNN 9.13; patch level 99 marks the emulator.
#define CUDNN_MAJOR 9
#define CUDNN_MINOR 13
#define CUDNN_PATCHLEVEL 99
#define CUDNN_VERSION (CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)
#define CUDNN_DIM_MAX 8

struct cudnnContext;
typedef struct cudnnContext* cudnnHandle_t;
struct cudnnTensorStruct;
typedef struct cudnnTensorStruct* cudnnTensorDescriptor_t;
struct cudnnFilterStruct;
typedef struct cudnnFilterStruct* cudnnFilterDescriptor_t;
struct cudnnConvolutionStruct;
typedef struct cudnnConvolutionStruct* cudnnConvolutionDescriptor_t;
struct cudnnActivationStruct;
typedef struct cudnnActivationStruct* cudnnActivationDescriptor_t;

typedef enum {
  CUDNN_STATUS_SUCCESS = 0,

  CUDNN_STATUS_NOT_INITIALIZED = 1001,
  CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH = 1002,
  CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH = 1003,
  CUDNN_STATUS_DEPRECATED = 1004,
  CUDNN_STATUS_LICENSE_ERROR = 1005,
  CUDNN_STATUS_RUNTIME_IN_PROGRESS = 1006,
  CUDNN_STATUS_RUNTIME_FP_OVERFLOW = 1007,
  CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED = 1008,

  CUDNN_STATUS_BAD_PARAM = 2000,
  CUDNN_STATUS_BAD_PARAM_NULL_POINTER = 2002,
  CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER = 2003,
  CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED = 2004,
  CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND = 2005,
  CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT = 2006,
  CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH = 2007,
  CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH = 2008,
  CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES = 2009,
  CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE = 2010,
  CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH = 2011,
  CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE = 2012,

  CUDNN_STATUS_NOT_SUPPORTED = 3000,
  CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN = 3001,
  CUDNN_STATUS_NOT_SUPPORTED_SHAPE = 3002,
  CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE = 3003,
  CUDNN_STATUS_NOT_SUPPORTED_LAYOUT = 3004,
  CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER = 3005,
  CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART = 3006,
  CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH = 3007,
  CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008,
  CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE = 3009,
  CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT = 3010,
  CUDNN_STATUS_NOT_SUPPORTED_PADDING = 3011,
  CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM = 3012,
  CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API = 3013,

  CUDNN_STATUS_INTERNAL_ERROR = 4000,
  CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED = 4001,
  CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE = 4002,
  CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003,
  CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004,
  CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM = 4005,
  CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED = 4006,

  CUDNN_STATUS_EXECUTION_FAILED = 5000,
  CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER = 5001,
  CUDNN_STATUS_EXECUTION_FAILED_CUBLAS = 5002,
  CUDNN_STATUS_EXECUTION_FAILED_CUDART = 5003,
  CUDNN_STATUS_EXECUTION_FAILED_CURAND = 5004,

  // Deprecated names kept by cuDNN 9.
  CUDNN_STATUS_ALLOC_FAILED = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
  CUDNN_STATUS_INVALID_VALUE = 2001,
  CUDNN_STATUS_ARCH_MISMATCH = CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH,
  CUDNN_STATUS_MAPPING_ERROR = CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED,
  CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING = CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING,
  CUDNN_STATUS_VERSION_MISMATCH = CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH,
} cudnnStatus_t;

typedef enum {
  CUDNN_DATA_FLOAT = 0,
  CUDNN_DATA_DOUBLE = 1,
  CUDNN_DATA_HALF = 2,
  CUDNN_DATA_INT8 = 3,
  CUDNN_DATA_INT32 = 4,
  CUDNN_DATA_INT8x4 = 5,
  CUDNN_DATA_UINT8 = 6,
  CUDNN_DATA_UINT8x4 = 7,
  CUDNN_DATA_INT8x32 = 8,
  CUDNN_DATA_BFLOAT16 = 9,
  CUDNN_DATA_INT64 = 10,
  CUDNN_DATA_BOOLEAN = 11,
  CUDNN_DATA_FP8_E4M3 = 12,
  CUDNN_DATA_FP8_E5M2 = 13,
  CUDNN_DATA_FAST_FLOAT_FOR_FP8 = 14,
  CUDNN_DATA_FP8_E8M0 = 15,
  CUDNN_DATA_FP4_E2M1 = 16,
  CUDNN_DATA_INT4 = 17,
  CUDNN_DATA_UINT4 = 18,
  CUDNN_DATA_UINT32 = 19,
} cudnnDataType_t;

typedef enum {
  CUDNN_DEFAULT_MATH = 0,
  CUDNN_TENSOR_OP_MATH = 1,
  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
  CUDNN_FMA_MATH = 3,
} cudnnMathType_t;

typedef enum {
  CUDNN_TENSOR_NCHW = 0,
  CUDNN_TENSOR_NHWC = 1,
  CUDNN_TENSOR_NCHW_VECT_C = 2,
} cudnnTensorFormat_t;

typedef enum {
  CUDNN_NOT_PROPAGATE_NAN = 0,
  CUDNN_PROPAGATE_NAN = 1,
} cudnnNanPropagation_t;

typedef enum {
  CUDNN_ACTIVATION_SIGMOID = 0,
  CUDNN_ACTIVATION_RELU = 1,
  CUDNN_ACTIVATION_TANH = 2,
  CUDNN_ACTIVATION_CLIPPED_RELU = 3,
  CUDNN_ACTIVATION_ELU = 4,
  CUDNN_ACTIVATION_IDENTITY = 5,
  CUDNN_ACTIVATION_SWISH = 6,
} cudnnActivationMode_t;

typedef enum {
  CUDNN_NON_DETERMINISTIC = 0,
  CUDNN_DETERMINISTIC = 1,
} cudnnDeterminism_t;

typedef enum {
  CUDNN_CONVOLUTION = 0,
  CUDNN_CROSS_CORRELATION = 1,
} cudnnConvolutionMode_t;

typedef enum {
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1,
  CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2,
  CUDNN_CONVOLUTION_FWD_ALGO_DIRECT = 3,
  CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4,
  CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5,
  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6,
  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7,
  CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8,
} cudnnConvolutionFwdAlgo_t;

typedef enum {
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT = 2,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING = 3,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD = 4,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5,
  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6,
} cudnnConvolutionBwdDataAlgo_t;

typedef enum {
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT = 2,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD = 4,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING = 6,
  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7,
} cudnnConvolutionBwdFilterAlgo_t;

typedef struct cudnnConvolutionFwdAlgoPerfStruct {
  cudnnConvolutionFwdAlgo_t algo;
  cudnnStatus_t status;
  float time;     // milliseconds
  size_t memory;  // workspace bytes
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
} cudnnConvolutionFwdAlgoPerf_t;

typedef struct cudnnConvolutionBwdDataAlgoPerfStruct {
  cudnnConvolutionBwdDataAlgo_t algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
} cudnnConvolutionBwdDataAlgoPerf_t;

typedef struct cudnnConvolutionBwdFilterAlgoPerfStruct {
  cudnnConvolutionBwdFilterAlgo_t algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t mathType;
  int reserved[3];
} cudnnConvolutionBwdFilterAlgoPerf_t;

// ---- backend (graph) API ----------------------------------------------------------------------

typedef void* cudnnBackendDescriptor_t;

typedef enum {
  CUDNN_POINTWISE_ADD = 0,
  CUDNN_POINTWISE_MUL = 1,
  CUDNN_POINTWISE_RELU_FWD = 100,
  CUDNN_POINTWISE_RELU_BWD = 200,
} cudnnPointwiseMode_t;

typedef enum {
  CUDNN_GENSTATS_SUM_SQSUM = 0,
} cudnnGenStatsMode_t;

typedef enum {
  CUDNN_HEUR_MODE_INSTANT = 0,
  CUDNN_HEUR_MODE_B = 1,
  CUDNN_HEUR_MODE_FALLBACK = 2,
  CUDNN_HEUR_MODE_A = 3,
} cudnnBackendHeurMode_t;

typedef enum {
  CUDNN_ATTR_POINTWISE_MODE = 0,
  CUDNN_ATTR_POINTWISE_MATH_PREC = 1,

  CUDNN_ATTR_CONVOLUTION_COMP_TYPE = 100,
  CUDNN_ATTR_CONVOLUTION_CONV_MODE = 101,
  CUDNN_ATTR_CONVOLUTION_DILATIONS = 102,
  CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES = 103,
  CUDNN_ATTR_CONVOLUTION_POST_PADDINGS = 104,
  CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS = 105,
  CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = 106,

  CUDNN_ATTR_ENGINEHEUR_MODE = 200,
  CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201,
  CUDNN_ATTR_ENGINEHEUR_RESULTS = 202,

  CUDNN_ATTR_ENGINECFG_ENGINE = 300,
  CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE = 303,

  CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400,
  CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401,
  CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402,

  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA = 701,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W = 703,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X = 704,
  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y = 705,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA = 707,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W = 709,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX = 710,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY = 711,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW = 715,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X = 716,
  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY = 717,

  CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR = 750,
  CUDNN_ATTR_OPERATION_POINTWISE_XDESC = 751,
  CUDNN_ATTR_OPERATION_POINTWISE_BDESC = 752,
  CUDNN_ATTR_OPERATION_POINTWISE_YDESC = 753,
  CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1 = 754,
  CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2 = 755,
  CUDNN_ATTR_OPERATION_POINTWISE_DXDESC = 756,
  CUDNN_ATTR_OPERATION_POINTWISE_DYDESC = 757,

  CUDNN_ATTR_OPERATION_GENSTATS_MODE = 770,
  CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC = 771,
  CUDNN_ATTR_OPERATION_GENSTATS_XDESC = 772,
  CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC = 773,
  CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC = 774,

  CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800,
  CUDNN_ATTR_OPERATIONGRAPH_OPS = 801,
  CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT = 802,

  CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900,
  CUDNN_ATTR_TENSOR_DATA_TYPE = 901,
  CUDNN_ATTR_TENSOR_DIMENSIONS = 902,
  CUDNN_ATTR_TENSOR_STRIDES = 903,
  CUDNN_ATTR_TENSOR_UNIQUE_ID = 906,
  CUDNN_ATTR_TENSOR_IS_VIRTUAL = 907,

  CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000,
  CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001,
  CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003,

  CUDNN_ATTR_ENGINE_OPERATION_GRAPH = 1300,
  CUDNN_ATTR_ENGINE_GLOBAL_INDEX = 1301,

  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC = 1620,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC = 1621,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC = 1622,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC = 1623,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC = 1624,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC = 1625,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC = 1626,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC = 1627,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC = 1628,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC = 1629,
  CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS = 1630,
} cudnnBackendAttributeName_t;

typedef enum {
  CUDNN_TYPE_HANDLE = 0,
  CUDNN_TYPE_DATA_TYPE = 1,
  CUDNN_TYPE_BOOLEAN = 2,
  CUDNN_TYPE_INT64 = 3,
  CUDNN_TYPE_FLOAT = 4,
  CUDNN_TYPE_DOUBLE = 5,
  CUDNN_TYPE_VOID_PTR = 6,
  CUDNN_TYPE_CONVOLUTION_MODE = 7,
  CUDNN_TYPE_HEUR_MODE = 8,
  CUDNN_TYPE_POINTWISE_MODE = 14,
  CUDNN_TYPE_BACKEND_DESCRIPTOR = 15,
  CUDNN_TYPE_GENSTATS_MODE = 16,
} cudnnBackendAttributeType_t;

typedef enum {
  CUDNN_BACKEND_POINTWISE_DESCRIPTOR = 0,
  CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR = 1,
  CUDNN_BACKEND_ENGINE_DESCRIPTOR = 2,
  CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3,
  CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4,
  CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5,
  CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10,
  CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11,
  CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12,
  CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR = 13,
  CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR = 14,
  CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15,
  CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16,
  CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17,
  CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR = 23,
} cudnnBackendDescriptorType_t;

extern "C" {

// ---- versions and errors ----------------------------------------------------------------------
size_t cudnnGetVersion(void);
size_t cudnnGetCudartVersion(void);
const char* cudnnGetErrorString(cudnnStatus_t status);
// The calling thread's last error message ("" if none), truncated to max_size - 1 characters.
void cudnnGetLastErrorString(char* message, size_t max_size);

// ---- handles ----------------------------------------------------------------------------------
cudnnStatus_t cudnnCreate(cudnnHandle_t* handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* streamId);

// ---- tensor and filter descriptors ------------------------------------------------------------
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w);
cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType, int n, int c,
                                           int h, int w, int nStride, int cStride, int hStride, int wStride);
cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t* dataType, int* n,
                                         int* c, int* h, int* w, int* nStride, int* cStride, int* hStride,
                                         int* wStride);

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w);
cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t filterDesc, cudnnDataType_t* dataType,
                                         cudnnTensorFormat_t* format, int* k, int* c, int* h, int* w);

// ---- convolution descriptors ------------------------------------------------------------------
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType);
cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t convDesc, int* pad_h, int* pad_w,
                                              int* u, int* v, int* dilation_h, int* dilation_w,
                                              cudnnConvolutionMode_t* mode, cudnnDataType_t* computeType);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType);
cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t* mathType);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount);
cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int* groupCount);
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int* n, int* c, int* h,
                                                    int* w);

// ---- workspace sizes --------------------------------------------------------------------------
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t* sizeInBytes);

// ---- algorithm search (blocking: waits for the handle's stream; overwrites the output buffer) ---
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void* y,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults, void* workSpace,
                                                     size_t workSpaceSizeInBytes);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const void* w, const cudnnTensorDescriptor_t dyDesc,
                                                          const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, void* dx,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perfResults,
                                                          void* workSpace, size_t workSpaceSizeInBytes);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                            const void* x, const cudnnTensorDescriptor_t dyDesc,
                                                            const void* y, const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t dwDesc, void* dw,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults,
                                                            void* workSpace, size_t workSpaceSizeInBytes);

// ---- convolutions: dst = alpha * result + beta * dst (dst is not read when beta == 0) ----------
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                           size_t workSpaceSizeInBytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxDesc, void* dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                             size_t workSpaceSizeInBytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwDesc, void* dw);

// ---- activations and the fused convolution (src/dnn.cc) ---------------------------------
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* activationDesc);
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc);
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc, cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t reluNanOpt, double coef);
cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t activationDesc,
                                           cudnnActivationMode_t* mode, cudnnNanPropagation_t* reluNanOpt,
                                           double* coef);
// y = act(alpha1 * conv(x) + alpha2 * z + bias)
cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void* alpha1, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* alpha2,
    const cudnnTensorDescriptor_t zDesc, const void* z, const cudnnTensorDescriptor_t biasDesc, const void* bias,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t yDesc, void* y);

// The backend API (see the top of this file for what the emulator accepts).
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t* descriptor);
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor);
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor);
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                       const void* arrayOfElements);
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount,
                                       int64_t* elementCount, void* arrayOfElements);
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack);

}  // extern "C"
