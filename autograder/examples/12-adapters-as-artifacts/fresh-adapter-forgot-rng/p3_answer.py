def reload(base, run_dir):
    """The model `base` with the adapter trained in the run folder `run_dir` attached, in eval mode."""
    # Typical mistake: attach an adapter with the run's settings and stop there; lora_B starts at zero.
    settings = json.loads((Path(run_dir) / "lora_config.json").read_text())
    model = get_peft_model(base, LoraConfig(**settings))
    return model.eval()
