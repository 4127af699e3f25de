"""Writes reference.safetensors with the reference implementation (safetensors 0.8.0,
`pip install safetensors numpy`). safetensors_reference_test reads it back and checks
that moefit's writer reproduces it byte for byte. Every value is arange-like so the
test can check contents without Python."""
import os

import numpy as np
from safetensors.numpy import save_file

tensors = {
    "model.layers.10.w": np.arange(15, dtype=np.float32).reshape(3, 5),
    "model.layers.2.w": np.arange(4, dtype=np.float16),
    "b": np.array([True, False, True]),
    "d": np.arange(4, dtype=np.float64).reshape(2, 2),
    "i8": np.arange(5, dtype=np.int8),
    "i16": np.arange(3, dtype=np.int16),
    "i32": np.arange(7, dtype=np.int32),
    "i64": np.array(5, dtype=np.int64),  # 0-rank
    "u8": np.zeros((0, 3), dtype=np.uint8),  # empty
    "u16": np.arange(2, dtype=np.uint16),
    "u32": np.arange(3, dtype=np.uint32),
    "u64": np.arange(1, dtype=np.uint64),
}
here = os.path.dirname(os.path.abspath(__file__))
save_file(tensors, os.path.join(here, "reference.safetensors"), metadata={"format": "pt", "k": "v"})
