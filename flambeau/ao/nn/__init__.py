"""`flambeau.ao.nn`: quantized module families (`quantized.dynamic`)."""
