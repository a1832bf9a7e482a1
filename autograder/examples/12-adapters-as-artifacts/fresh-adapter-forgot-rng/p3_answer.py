def reload(base, adapter_dir):
    """The model `base` with the adapter saved in `adapter_dir` attached, in eval mode."""
    # Typical mistake: "reload" by attaching an adapter with the same settings; lora_B starts at zero.
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"]))
    return model.eval()
