# Settings shared by every tandem target. LibTorch headers are heavy (~15 s per translation unit with 1.13,
# more with 2.x), so targets precompile the few they always need: one precompiled header per target, or,
# with REUSE_PCH_FROM, the one another target with the same compile flags already built (the test programs
# share tandem_test_support's).
function(tandem_target_defaults target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "REUSE_PCH_FROM" "")
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(arg_REUSE_PCH_FROM)
    target_precompile_headers(${target} REUSE_FROM ${arg_REUSE_PCH_FROM})
  else()
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  endif()
endfunction()
