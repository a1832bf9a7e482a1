def reload(base, run_dir):
    """The model `base` with the adapter trained in the run folder `run_dir` attached, in eval mode."""
    # Typical mistake: the trained factors are loaded, but the model is returned as get_peft_model left it, in
    # training mode: dropout stays on.
    settings = json.loads((Path(run_dir) / "lora_config.json").read_text())
    model = get_peft_model(base, LoraConfig(**settings))
    artifacts.load_checkpoint(Path(run_dir) / "checkpoint.pt", model, restore_rng=False)
    return model
