"""torch.distributed._composable: the import path of FSDP2 before PyTorch 2.6 (`_composable.fsdp`)."""
