// placeholder until the index lands; replaced by the index-wasm build
