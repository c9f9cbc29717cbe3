"""Which oracle test proves which (engine, target, source format) cell of the release matrix."""

# (engine, target, source format) -> (test file, test) that proves it against the engine's own code
ORACLE_TESTS = {
    ("sglang", "sm90-cutlass", "gpt-oss"): ("test_engine_profiles.py", "test_gpt_oss_sm90_cutlass_equals_sglang"),
    ("vllm", "sm90-cutlass", "gpt-oss"): ("test_vllm_profile.py", "test_gpt_oss_flashinfer_cutlass_equals_vllm"),
    ("sglang", "deepep-bf16", "bf16-moe"): ("test_engine_profiles.py", "test_bf16_moe_deepep_bf16_equals_sglang"),
    ("sglang", "sm90-cutlass", "deepseek-v4"): ("test_engine_profiles.py", "test_deepseek_v4_sm90_cutlass_equals_sglang"),
    ("sglang", "sm100-trtllm", "gpt-oss"): ("test_engine_profiles.py", "test_gpt_oss_sm100_trtllm_equals_sglang"),
    ("sglang", "sm100-trtllm", "deepseek-v4"): ("test_engine_profiles.py", "test_deepseek_v4_sm100_trtllm_equals_sglang"),
    ("sglang", "cutedsl", "modelopt-nvfp4"): ("test_engine_profiles.py", "test_modelopt_nvfp4_cutedsl_equals_sglang"),
    ("sglang", "cutedsl-deepep", "modelopt-nvfp4"): ("test_engine_profiles.py", "test_modelopt_nvfp4_cutedsl_equals_sglang"),
    ("vllm", "cutedsl", "modelopt-nvfp4"): ("test_vllm_profile.py", "test_modelopt_nvfp4_cutedsl_equals_vllm"),
    ("vllm", "sm90-cutlass", "deepseek-v4"): ("test_vllm_profile.py", "test_deepseek_v4_flashinfer_cutlass_equals_vllm"),
    ("vllm", "sm100-trtllm", "gpt-oss"): ("test_vllm_profile.py", "test_gpt_oss_sm100_trtllm_equals_vllm"),
    ("vllm", "sm100-trtllm", "deepseek-v4"): ("test_vllm_profile.py", "test_deepseek_v4_sm100_trtllm_equals_vllm"),
    ("sglang", "sm90-marlin", "gpt-oss"): ("test_engine_profiles.py", "test_gpt_oss_sm90_marlin_equals_sglang"),
    ("sglang", "sm90-marlin", "deepseek-v4"): ("test_engine_profiles.py", "test_deepseek_v4_sm90_marlin_equals_sglang"),
    ("vllm", "sm90-marlin", "deepseek-v4"): ("test_vllm_profile.py", "test_deepseek_v4_marlin_equals_vllm"),
    ("sglang", "sm90-cutlass-w4a8", "gpt-oss"): ("test_engine_profiles.py", "test_gpt_oss_sm90_cutlass_w4a8_equals_sglang"),
    ("sglang", "sm90-cutlass-w4a8", "deepseek-v4"): ("test_engine_profiles.py", "test_deepseek_v4_sm90_cutlass_w4a8_equals_sglang"),
}
