from tqdm.auto import tqdm


def train_steps(model, windows, optimizer, scheduler, progress=True):
    """One optimizer step per window, every supervised token weighted equally; returns the window losses."""
    losses = []
    model.train()
    for window in tqdm(windows, desc="training", unit="step", disable=not progress):
        total = 0.0
        for b in window:
            loss = model(**b).loss / len(window)  # each micro-batch's own mean, averaged over the window
            loss.backward()
            total += loss.item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return losses
