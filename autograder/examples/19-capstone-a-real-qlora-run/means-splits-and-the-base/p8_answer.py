from peft import PeftModel


def merge_onto_w16(adapter_dir, path):
    """The bf16 base at `path` with the saved adapter merged into its weights (a plain transformers model)."""
    nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    base = AutoModelForCausalLM.from_pretrained(path, quantization_config=nf4, dtype=torch.bfloat16, device_map="cpu")
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
