// The dimension letters used in shape comments throughout the code, defined once.
//
//   B  sequences in one micro-batch (one routing group)     T  tokens per sequence (train.seq_len)
//   N  tokens in one micro-batch, N = B * T                 D  model width (model.d_model)
//   H  attention heads                                      Dh head width, Dh = D / H
//   F  hidden width of the dense SwiGLU MLP                 V  vocabulary size
//   L  layers                                               E  routed experts, K experts per token
//
// Matrices are row-major. A weight W of a linear map from width I to width O is stored (I, O) and
// applied as y = x W, so x: (N, I), y: (N, O).
#pragma once
