# The node-gyp build of the addon, for machines without CMake: `npm run build:gyp`
# (scripts/gyp-build.mjs: node-gyp rebuild --nodedir=<the running Node's prefix>, no download).
# It builds build/Release/resnet_cuda.node with the CPU backend (oneDNN), JPEG decoding
# (libjpeg-turbo) and the CPU process groups (Gloo), from the same sources, defines and flags as
# CMakeLists.txt. The CUDA backend (libresnet_cuda_backend.so) is built by CMake only
# (`npm run build:native`): without it the addon runs on the CPU.
# The libraries come from scripts/gyp-deps.mjs: the shared oneDNN and the static libjpeg-turbo and
# Gloo of RESNET_DEPS_PREFIX's prefixes (':'-separated) or of `scripts/deps --prefix`, else (or with
# RESNET_CUDA_SYSTEM_LIBS=1) the system's packages (Debian/Ubuntu: libdnnl-dev, libjpeg-dev,
# libgloo-dev).
# `npm install` never runs this file: the package's install script uses the prebuilt binary.
{
  'variables': {
    'rc_version': '<!(node scripts/gyp-deps.mjs version)',
  },
  'target_defaults': {
    # The static libraries' headers (the include_dirs of scripts/gyp-deps.mjs) and node-addon-api's
    # come as system headers (-isystem, as CMakeLists.txt includes them), so that the warnings below
    # are about our own sources only.
    'cflags': ['-fPIC', '-fvisibility=hidden', '-fopenmp', '<!@(node scripts/gyp-deps.mjs cflags)'],
    # C++17 without GNU extensions, with exceptions and RTTI, as CMakeLists.txt compiles it.
    # node-gyp's own defaults that CMakeLists.txt does not have are taken out.
    'cflags!': ['-fno-exceptions', '-Wno-unused-parameter', '-fno-omit-frame-pointer'],
    'cflags_cc!': ['-fno-exceptions', '-fno-rtti', '-std=gnu++17', '-std=gnu++20'],
    'cflags_cc': ['-std=c++17'],
    'defines': ['NDEBUG'],
    # The static libraries' symbols stay out of the dynamic symbol table, so that another libjpeg in
    # the same process (sharp) binds to its own. No executable stack: newer glibc refuses to load a
    # library that asks for one (as in CMakeLists.txt). The run path $ORIGIN (RUNPATH, as CMake
    # writes it) finds a libdnnl.so.3 and libgomp.so.1 beside the addon first ($$: make's escape).
    'ldflags': ['-Wl,--exclude-libs,ALL', '-Wl,-z,noexecstack', '-Wl,--enable-new-dtags', "-Wl,-rpath,'$$ORIGIN'"],
  },
  'targets': [
    {
      # sqrt may set errno, which keeps GCC from vectorising the optimizer loops; nothing reads it
      # there (as CMakeLists.txt compiles native/cpu/optim.cc).
      'target_name': 'rc_cpu_optim',
      'type': 'static_library',
      'sources': ['native/cpu/optim.cc'],
      'cflags': ['-fno-math-errno'],
    },
    {
      'target_name': 'resnet_cuda',
      'dependencies': ['rc_cpu_optim'],
      'sources': ['<!@(node scripts/gyp-deps.mjs sources)'],
      # NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS: see CMakeLists.txt (the data loader's workers).
      'defines': [
        'NAPI_VERSION=8',
        'NAPI_CPP_EXCEPTIONS',
        'NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS',
        'RC_VERSION="<(rc_version)"',
      ],
      'libraries': ['<!@(node scripts/gyp-deps.mjs libraries)'],
    },
  ],
}
