"""Which engine releases' own load-time code reproduces which bakes (generated: do not edit by hand).

Written by ``bin/prove-releases --write`` (``tests/engine_releases/prove.py``), which runs each release's own
preparation code on CPU (the oracle tests) against moebake's bakes. ``MATRIX[engine][release]``:

* ``flashinfer``: the FlashInfer release that engine release pins, and ``flashinfer_layout`` the SM90 fp4 layout that
  FlashInfer reads (:func:`moebake.layouts.flashinfer_versions.layout_for_flashinfer`): the one its servers read;
* ``cells``: ``"target/source format"`` -> the rule (:data:`moebake.schema.profiles.RULES`) whose entry that release
  was proven to build, byte for byte; a cell absent here is refused for that release;
* ``unproven``: ``"target/source format"`` -> what the oracle run printed where no rule's bytes matched.
"""

# ruff: noqa: E501  (generated: each oracle run's message is kept whole)
MATRIX = {'sglang': {'0.5.17': {'flashinfer': '0.6.15.post1',
                       'flashinfer_layout': 'v1',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.22: '
                                                                     'test_sglang_plugin_targets::test_plugin_layer_equals_stock_sglang[sm90-cutlass-w4a8/deepseek-v4]: '
                                                                     'moebake.engines.sglang.refusals.MoebakeRefusal: '
                                                                     'moebake: this sm90-cutlass-w4a8 bake holds '
                                                                     "FlashInfer's Humming W4A8 weights, the server "
                                                                     'runs SM90 MXFP4 MoE in W4A16; start it with '
                                                                     '--flashinfer-mxfp4-',
                                    'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.22: '
                                                                 'test_sglang_plugin_targets::test_plugin_layer_equals_stock_sglang[sm90-cutlass-w4a8/gpt-oss]: '
                                                                 'moebake.engines.sglang.refusals.MoebakeRefusal: '
                                                                 'moebake: this sm90-cutlass-w4a8 bake holds '
                                                                 "FlashInfer's Humming W4A8 weights, the server runs "
                                                                 'SM90 MXFP4 MoE in W4A16; start it with '
                                                                 '--flashinfer-mxfp4-'}},
            '0.5.18': {'flashinfer': '0.6.17',
                       'flashinfer_layout': 'v1',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.22: '
                                                                     'test_sglang_plugin_targets::test_plugin_layer_equals_stock_sglang[sm90-cutlass-w4a8/deepseek-v4]: '
                                                                     'moebake.engines.sglang.refusals.MoebakeRefusal: '
                                                                     'moebake: this sm90-cutlass-w4a8 bake holds '
                                                                     "FlashInfer's Humming W4A8 weights, the server "
                                                                     'runs SM90 MXFP4 MoE in W4A16; start it with '
                                                                     '--flashinfer-mxfp4-',
                                    'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.22: '
                                                                 'test_sglang_plugin_targets::test_plugin_layer_equals_stock_sglang[sm90-cutlass-w4a8/gpt-oss]: '
                                                                 'moebake.engines.sglang.refusals.MoebakeRefusal: '
                                                                 'moebake: this sm90-cutlass-w4a8 bake holds '
                                                                 "FlashInfer's Humming W4A8 weights, the server runs "
                                                                 'SM90 MXFP4 MoE in W4A16; start it with '
                                                                 '--flashinfer-mxfp4-'}},
            '0.5.19': {'flashinfer': '0.6.18',
                       'flashinfer_layout': 'v2',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {}},
            '0.5.20': {'flashinfer': '0.6.18',
                       'flashinfer_layout': 'v2',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {}},
            '0.5.21': {'flashinfer': '0.6.18',
                       'flashinfer_layout': 'v2',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {}},
            '0.5.22': {'flashinfer': '0.7.1',
                       'flashinfer_layout': 'v2',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.22',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {}},
            '0.5.23': {'flashinfer': '0.7.2',
                       'flashinfer_layout': 'v2',
                       'cells': {'cutedsl-deepep/modelopt-nvfp4': 'sglang-0.5.17',
                                 'cutedsl/modelopt-nvfp4': 'sglang-0.5.17',
                                 'deepep-bf16/bf16-moe': 'sglang-0.5.17',
                                 'sm100-trtllm/deepseek-v4': 'sglang-0.5.17',
                                 'sm100-trtllm/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass-w4a8/gpt-oss': 'sglang-0.5.17',
                                 'sm90-cutlass/deepseek-v4': 'sglang-0.5.17',
                                 'sm90-cutlass/gpt-oss': 'sglang-0.5.17',
                                 'sm90-marlin/deepseek-v4': 'sglang-0.5.22',
                                 'sm90-marlin/gpt-oss': 'sglang-0.5.17'},
                       'unproven': {}}},
 'vllm': {'0.26.0': {'flashinfer': '0.6.14',
                     'flashinfer_layout': 'v1',
                     'cells': {},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'failed on setup with "ModuleNotFoundError: No module '
                                                            'named \'cutlass\'"',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              'failed on setup with "assert (256, 256) == (256, 128)',
                                  'sm100-trtllm/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss_sm100::test_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                          'failed on setup with "assert (256, 256) == (256, 128)',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'failed on setup with "ValueError: Unsupported '
                                                              'mxfp4_backend for Mxfp4MoEMethod: '
                                                              'Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16. Expected '
                                                              'TRTLLM, Triton, AITER, or XPU backend."',
                                  'sm90-cutlass/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss::test_an_sglang_bake_that_serves_vllm_loads: '
                                                          'moebake.errors.EngineRefusal: moebake (vLLM plugin): '
                                                          '/tmp/pytest-of-root/pytest-442/test_an_sglang_bake_that_serve0/out/moebake.json: '
                                                          "baked for sglang 0.5.23 (engine-exact), not vLLM 0.26.0's "
                                                          'bytes; r',
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                             "keyword argument 'num_hash_layers'"}},
          '0.27.0': {'flashinfer': '0.6.16.post3',
                     'flashinfer_layout': 'v1',
                     'cells': {},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'failed on setup with "ModuleNotFoundError: No module '
                                                            'named \'cutlass\'"',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                              "keyword argument 'num_hash_layers'",
                                  'sm100-trtllm/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss_sm100::test_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                          "ImportError: cannot import name 'weights_already_processed' "
                                                          "from 'vllm.model_executor.utils' "
                                                          '(/root/.cache/moebake/engine-trees/vllm-0.27.0/vllm/model_executor/utils.py)',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'failed on setup with "ValueError: Unsupported '
                                                              'mxfp4_backend for Mxfp4MoEMethod: '
                                                              'Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16. Expected '
                                                              'TRTLLM, Triton, AITER, XPU, or emulation backend."',
                                  'sm90-cutlass/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss::test_an_sglang_bake_that_serves_vllm_loads: '
                                                          'moebake.errors.EngineRefusal: moebake (vLLM plugin): '
                                                          '/tmp/pytest-of-root/pytest-439/test_an_sglang_bake_that_serve0/out/moebake.json: '
                                                          "baked for sglang 0.5.23 (engine-exact), not vLLM 0.27.0's "
                                                          'bytes; r',
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                             "keyword argument 'num_hash_layers'"}},
          '0.27.1': {'flashinfer': '0.6.16.post3',
                     'flashinfer_layout': 'v1',
                     'cells': {},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'failed on setup with "ModuleNotFoundError: No module '
                                                            'named \'cutlass\'"',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                              "keyword argument 'num_hash_layers'",
                                  'sm100-trtllm/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss_sm100::test_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                          "ImportError: cannot import name 'weights_already_processed' "
                                                          "from 'vllm.model_executor.utils' "
                                                          '(/root/.cache/moebake/engine-trees/vllm-0.27.1/vllm/model_executor/utils.py)',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'failed on setup with "ValueError: Unsupported '
                                                              'mxfp4_backend for Mxfp4MoEMethod: '
                                                              'Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16. Expected '
                                                              'TRTLLM, Triton, AITER, XPU, or emulation backend."',
                                  'sm90-cutlass/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss::test_an_sglang_bake_that_serves_vllm_loads: '
                                                          'moebake.errors.EngineRefusal: moebake (vLLM plugin): '
                                                          '/tmp/pytest-of-root/pytest-432/test_an_sglang_bake_that_serve0/out/moebake.json: '
                                                          "baked for sglang 0.5.23 (engine-exact), not vLLM 0.27.1's "
                                                          'bytes; r',
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                             "keyword argument 'num_hash_layers'"}},
          '0.28.0': {'flashinfer': '0.6.16.post3',
                     'flashinfer_layout': 'v1',
                     'cells': {},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'AssertionError: w13_weight',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                              "keyword argument 'num_hash_layers'",
                                  'sm100-trtllm/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss_sm100::test_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                          "ImportError: cannot import name 'weights_already_processed' "
                                                          "from 'vllm.model_executor.utils' "
                                                          '(/root/.cache/moebake/engine-trees/vllm-0.28.0/vllm/model_executor/utils.py)',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                              "keyword argument 'num_hash_layers'",
                                  'sm90-cutlass/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss::test_an_sglang_bake_that_serves_vllm_loads: '
                                                          'moebake.errors.EngineRefusal: moebake (vLLM plugin): '
                                                          '/tmp/pytest-of-root/pytest-425/test_an_sglang_bake_that_serve1/out/moebake.json: '
                                                          "baked for sglang 0.5.23 (engine-exact), not vLLM 0.28.0's "
                                                          'bytes; r',
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                             "keyword argument 'num_hash_layers'"}},
          '0.29.0': {'flashinfer': '0.6.18',
                     'flashinfer_layout': 'v2',
                     'cells': {},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'AssertionError: w13_weight',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                              "keyword argument 'num_hash_layers'",
                                  'sm100-trtllm/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss_sm100::test_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                          "ImportError: cannot import name 'weights_already_processed' "
                                                          "from 'vllm.model_executor.utils' "
                                                          '(/root/.cache/moebake/engine-trees/vllm-0.29.0/vllm/model_executor/utils.py)',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                              "keyword argument 'num_hash_layers'",
                                  'sm90-cutlass/gpt-oss': 'vllm-0.33.0: '
                                                          'test_gpt_oss::test_post_load_step_only_builds_the_kernel[False]: '
                                                          "ImportError: cannot import name 'weights_already_processed' "
                                                          "from 'vllm.model_executor.utils' "
                                                          '(/root/.cache/moebake/engine-trees/vllm-0.29.0/vllm/model_executor/utils.py)',
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             'TypeError: DeepseekV4MoE.__init__() got an unexpected '
                                                             "keyword argument 'num_hash_layers'"}},
          '0.30.0': {'flashinfer': '0.6.18.post1',
                     'flashinfer_layout': 'v2',
                     'cells': {'sm100-trtllm/gpt-oss': 'vllm-0.30.0', 'sm90-cutlass/gpt-oss': 'vllm-0.30.0'},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'AssertionError: w13_weight',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              "AttributeError: 'Mxfp4MoEMethod' object has no "
                                                              "attribute 'activation_key'",
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              "AttributeError: 'Mxfp4MoEMethod' object has no "
                                                              "attribute 'activation_key'",
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             "AttributeError: 'Mxfp4MoEMethod' object has no attribute "
                                                             "'activation_key'"}},
          '0.31.0': {'flashinfer': '0.7.0.post1',
                     'flashinfer_layout': 'v2',
                     'cells': {'sm100-trtllm/gpt-oss': 'vllm-0.30.0', 'sm90-cutlass/gpt-oss': 'vllm-0.30.0'},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'AssertionError: w13_weight',
                                  'sm100-trtllm/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source[False]: '
                                                              "AttributeError: 'Mxfp4MoEMethod' object has no "
                                                              "attribute 'activation_key'",
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              "AttributeError: 'Mxfp4MoEMethod' object has no "
                                                              "attribute 'activation_key'",
                                  'sm90-marlin/deepseek-v4': 'vllm-0.33.0: '
                                                             'test_deepseek_v4::test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                             "AttributeError: 'Mxfp4MoEMethod' object has no attribute "
                                                             "'activation_key'"}},
          '0.32.0': {'flashinfer': '0.7.0.post1',
                     'flashinfer_layout': 'v2',
                     'cells': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0',
                               'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/deepseek-v4': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {}},
          '0.33.0': {'flashinfer': '0.7.2.post1',
                     'flashinfer_layout': 'v2',
                     'cells': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0',
                               'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/deepseek-v4': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {}}}}
