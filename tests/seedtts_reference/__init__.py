"""seed-tts-eval's speaker-verification model, the parity reference of tests/test_ecapa.py (tests only).

From github.com/BytedanceSpeech/seed-tts-eval (commit 752f429), thirdparty/UniSpeech:
- ecapa_tdnn.py: downstreams/speaker_verification/models/ecapa_tdnn.py, verbatim but for the torchaudio
  import (UniSpeech's downstreams; thirdparty/UniSpeech/LICENSE is CC BY-SA 3.0; the file credits
  lawlict/ECAPA-TDNN);
- WavLM.py, modules.py: WavLM/WavLM.py and WavLM/modules.py, verbatim but for one relative import
  (Copyright (c) 2021 Microsoft, MIT, per their headers; s3prl's wavlm upstream is this code);
- s3prl_wavlm.py: ours, the behaviour of s3prl's wavlm UpstreamExpert (the hub trunk ECAPA_TDNN loads).
voxpipe's own implementation is voxpipe/evaluate/ecapa.py; nothing in voxpipe/ imports this package.
"""
