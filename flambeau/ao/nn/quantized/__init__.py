"""`flambeau.ao.nn.quantized`: quantized modules; dynamic quantization in `dynamic`."""
