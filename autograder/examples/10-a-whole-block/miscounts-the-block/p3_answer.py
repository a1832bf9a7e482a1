# Your answer goes in `answer_p3`.
answer_p3 = n_layers * lora_param_count(hf_shapes, ["q_proj", "gate_proj"], 8)
