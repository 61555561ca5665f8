# Settings shared by every tandem target. LibTorch headers are heavy (~25 s per translation unit with 1.13 when
# parsed, more with 2.x), so targets precompile the few they always need: one precompiled header per target, or,
# with REUSE_PCH_FROM, the one another target with the same compile flags already built (the test programs
# share tandem_test_support's). Loading that header still costs each translation unit ~8 s (1.13; about twice
# that with 2.x), so with UNITY a target compiles its sources eight to a unit: a fresh build loads it an eighth
# as often. A unity target's sources must not define the same file-local name twice.
function(tandem_target_defaults target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "UNITY" "REUSE_PCH_FROM" "")
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(arg_REUSE_PCH_FROM)
    target_precompile_headers(${target} REUSE_FROM ${arg_REUSE_PCH_FROM})
  else()
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  endif()
  if(arg_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()
