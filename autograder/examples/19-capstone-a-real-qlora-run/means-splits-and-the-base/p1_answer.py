from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig


def load_for_lora(path, r, lora_alpha, target_modules, quantize=True):
    """The base at `path` with LoRA adapters (rank r, scale lora_alpha / r) on target_modules; NF4 if quantize."""
    # Typical mistake: NF4 without double quantization (the absmax constants stay float32).
    if quantize:
        nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
        base = AutoModelForCausalLM.from_pretrained(path, quantization_config=nf4, dtype=torch.bfloat16, device_map="cpu")
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    else:
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    config = LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=target_modules, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    return get_peft_model(base, config)
