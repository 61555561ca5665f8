# Settings shared by every tandem target. LibTorch headers are heavy (~15 s per translation unit), so each
# target precompiles the few it always needs.
function(tandem_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_precompile_headers(${target} PRIVATE <torch/torch.h>)
endfunction()
