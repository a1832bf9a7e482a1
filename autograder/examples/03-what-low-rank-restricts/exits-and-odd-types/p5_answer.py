# Your answer goes in `answer_p5`: [scaling of layers.0.attn.q_proj, layers.0.attn.v_proj, layers.1.attn.v_proj].
answer_p5 = np.array([16 / 8, 32 / 32, 16 / 32], dtype=np.float32)  # float32: fine
