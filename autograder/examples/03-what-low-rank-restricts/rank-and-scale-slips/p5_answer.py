# Your answer goes in `answer_p5`: {"rank_pattern": {key: r, ...}, "alpha_pattern": {key: lora_alpha, ...}}.
# Typical mistake: the ranks set with rank_pattern and alpha_pattern left empty, as if rank_pattern set the scaling
# too; every module keeps lora_alpha = 16, so q_proj stays at 16 / 8 = 2 and v_proj drops to 16 / 16 = 1.
answer_p5 = {"rank_pattern": {r"layers\.1\..*": 4, "v_proj": 16, "up_proj": 32}, "alpha_pattern": {}}
