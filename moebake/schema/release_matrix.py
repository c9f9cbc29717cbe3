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
                     'cells': {'sm100-trtllm/deepseek-v4': 'vllm-0.26.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.26.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'failed on setup with "ModuleNotFoundError: No module '
                                                            'named \'cutlass\'"',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'failed on setup with "ValueError: Unsupported '
                                                              'mxfp4_backend for Mxfp4MoEMethod: '
                                                              'Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16. Expected '
                                                              'TRTLLM, Triton, AITER, or XPU backend."'}},
          '0.27.0': {'flashinfer': '0.6.16.post3',
                     'flashinfer_layout': 'v1',
                     'cells': {'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'failed on setup with "ModuleNotFoundError: No module '
                                                            'named \'cutlass\'"',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'failed on setup with "ValueError: Unsupported '
                                                              'mxfp4_backend for Mxfp4MoEMethod: '
                                                              'Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16. Expected '
                                                              'TRTLLM, Triton, AITER, XPU, or emulation backend."'}},
          '0.27.1': {'flashinfer': '0.6.16.post3',
                     'flashinfer_layout': 'v1',
                     'cells': {'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {'cutedsl/modelopt-nvfp4': 'vllm-0.33.0: '
                                                            'test_modelopt_nvfp4::test_loaded_parameters_equal_stock_vllm: '
                                                            'failed on setup with "ModuleNotFoundError: No module '
                                                            'named \'cutlass\'"',
                                  'sm90-cutlass/deepseek-v4': 'vllm-0.33.0: '
                                                              'test_deepseek_v4::test_served_parameters_equal_stock_vllms_preparation_of_the_source[False]: '
                                                              'failed on setup with "ValueError: Unsupported '
                                                              'mxfp4_backend for Mxfp4MoEMethod: '
                                                              'Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16. Expected '
                                                              'TRTLLM, Triton, AITER, XPU, or emulation backend."'}},
          '0.28.0': {'flashinfer': '0.6.16.post3',
                     'flashinfer_layout': 'v1',
                     'cells': {'cutedsl/modelopt-nvfp4': 'vllm-0.30.0',
                               'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/deepseek-v4': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {}},
          '0.29.0': {'flashinfer': '0.6.18',
                     'flashinfer_layout': 'v2',
                     'cells': {'cutedsl/modelopt-nvfp4': 'vllm-0.30.0',
                               'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/deepseek-v4': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {}},
          '0.30.0': {'flashinfer': '0.6.18.post1',
                     'flashinfer_layout': 'v2',
                     'cells': {'cutedsl/modelopt-nvfp4': 'vllm-0.30.0',
                               'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/deepseek-v4': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {}},
          '0.31.0': {'flashinfer': '0.7.0.post1',
                     'flashinfer_layout': 'v2',
                     'cells': {'cutedsl/modelopt-nvfp4': 'vllm-0.30.0',
                               'sm100-trtllm/deepseek-v4': 'vllm-0.30.0',
                               'sm100-trtllm/gpt-oss': 'vllm-0.30.0',
                               'sm90-cutlass/deepseek-v4': 'vllm-0.30.0',
                               'sm90-cutlass/gpt-oss': 'vllm-0.30.0',
                               'sm90-marlin/deepseek-v4': 'vllm-0.30.0'},
                     'unproven': {}},
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
