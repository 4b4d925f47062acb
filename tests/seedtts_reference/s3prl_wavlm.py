"""What `torch.hub.load('s3prl/s3prl', 'wavlm_large')` hands seed-tts-eval's ECAPA_TDNN, built offline.

s3prl's wavlm `UpstreamExpert` (s3prl/upstream/wavlm/expert.py) wraps UniSpeech's WavLM (the copy in
WavLM.py here) and returns `{"hidden_states": [...]}`: forward hooks take the input of every encoder layer
(time-first, transposed back) and the encoder's output (after its final layer norm), 25 tensors for
WavLM-Large. Its forward layer-normalises each wave when the config says `normalize`, pads the batch and
passes the padding mask. This is a port of that behaviour for the parity test only, with the WavLM built
from a config instead of the hub's downloaded checkpoint (the test loads weights into it afterwards).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from .WavLM import WavLM, WavLMConfig


class WavLMExpert(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = WavLMConfig(cfg)
        self.model = WavLM(self.cfg)
        self.model.feature_grad_mult = 0.0
        self.model.encoder.layerdrop = 0.0
        self._hidden: list[torch.Tensor] = []
        for layer in self.model.encoder.layers:
            layer.register_forward_hook(lambda _m, args, _out: self._hidden.append(args[0].transpose(0, 1)))
        self.model.encoder.register_forward_hook(lambda _m, _args, out: self._hidden.append(out[0]))

    def forward(self, wavs: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
        if self.cfg.normalize:
            wavs = [F.layer_norm(wav, wav.shape) for wav in wavs]
        lengths = torch.LongTensor([len(wav) for wav in wavs])
        padding_mask = ~torch.lt(torch.arange(int(max(lengths))).unsqueeze(0), lengths.unsqueeze(1))
        self._hidden = []
        padded = pad_sequence(wavs, batch_first=True)
        self.model.extract_features(padded, padding_mask=padding_mask, mask=False)
        hidden, self._hidden = self._hidden, []
        return {"hidden_states": hidden}
