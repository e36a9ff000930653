"""The engine's CPU fast path: what a forward on a CPU does differently, each piece bit for bit (or, for the decode
attention, to the last bit of a sum) the model's own numbers.

- `attention`: SDPA under the engine's additive mask with grouped key and value heads read in place, a decode
  step's attention as two matmuls, a packed or levelled chunk computed in its parts;
- `layers`: a llama-family decoder run layer by layer, and each layer's ops run in the engine;
- `malloc`: glibc told to keep freed cache buffers for the next allocation.

`TorchEngine.__init__` decides which of these a model gets; accelerators keep transformers' own path.
"""
