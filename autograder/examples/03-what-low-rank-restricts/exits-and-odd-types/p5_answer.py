# Your answer goes in `answer_p5`: {"rank_pattern": {key: r, ...}, "alpha_pattern": {key: lora_alpha, ...}}.
# NumPy int64 ranks and float32 alphas: fine (right answer)
answer_p5 = {"rank_pattern": {r"layers\.1\..*": np.int64(4), "v_proj": np.int64(16), "up_proj": np.int64(32)},
             "alpha_pattern": {r"layers\.1\..*": np.float32(16), "q_proj": np.float32(8), "v_proj": np.float32(32)}}
