"""The model zoo: every torchvision classification, segmentation and detection model, torch.nn's
attention and recurrent blocks, and torchaudio's models and feature transforms, eager vs.
dynamo.optimize, correctness first.

For each torchvision model: random weights (weights=None, weights_backbone=None: nothing is
downloaded; weight matrices initialized to zeros, like ViT's head, get random values too, or the
output would be all zeros), eval mode, batch 1, torch.no_grad(); detection models keep every box
(score threshold 0) and, but for SSD, work at the input's size instead of resizing to 800.
Family nn: TransformerEncoderLayer (d_model 256, 8 heads, feed-forward 1024), a TransformerEncoder
of 2 of them, TransformerDecoderLayer and MultiheadAttention on [1, 64, 256], LSTM (64 -> 128, 2
layers) on [1, 32, 64], Transformer (d_model 128, 4 heads, 2 + 2 layers, feed-forward 256) on
[1, 64, 128]; all batch_first. Family audio (torchaudio 0.13, random weights): Wav2Letter on a
[1, 1, 8000] waveform, DeepSpeech on [1, 1, 50, 64] features, a small ConvTasNet on [1, 1, 4000],
wav2vec2_base on [1, 8000], Conformer (80 features, 2 layers) on [1, 100, 80], MelSpectrogram and
MFCC (16 kHz) on [1, 16000]. The zoo calls model(x): a block that takes several inputs or returns
a tuple is wrapped in a one-input Module (decoders and nn.Transformer get x as target and memory,
MultiheadAttention is self-attention without weights, LSTM and Conformer return their output only,
Conformer's lengths tensor is built inside the call).
The model and a deep copy are built; the copy goes through dynamo.optimize.
Each of --calls calls (default 8; 6 for detection, the slowest family, so that the whole zoo
takes about 15 minutes on two cores and a detection model's parts settle: their post-processing
is left to CPython over the first calls, see dynamo.config.compile_parts) feeds both the same
fresh random input (generated from the call's seed, cloned per side) and compares every output
(nested tuples/lists/dicts of tensors):
float tensors with allclose(rtol 1e-3, atol 1e-3 * max|eager output|), everything else exactly.

Per model: status, largest error over the calls, largest |eager output|, native runs and traces
(+ side traces) compiled (dynamo.counters() deltas), the first fallback reason (dynamo.report()),
and the times. Calls rotate which side runs first; call 1 is left out of the comparison of
speeds (dynamo records and compiles there). A model whose eager call takes under 20 ms
(SAMPLE_S) has each later call timed as the mean of back-to-back calls on both sides, as many as
fit 20 ms at that speed (at most 50; "repeat" in --json): a single sub-millisecond call measures
mostly the timer and the scheduler. After the checked calls, a model under 1.5 s per eager call
is timed again with each side alone (6 samples each: dynamo, eager, eager with 1-thread BLAS, a
pause before each; "alone" in --json), and those samples are the ones compared: interleaved,
each side starts while the other's threads still spin (OpenBLAS's after a product, OpenMP's
after a parallel region), which costs whichever side runs next 10-20%. Eager is timed under every setting a user can pick
(EAGER_SETTINGS): GNU OpenMP's default, whose threads spin after each parallel region and fight a
threaded OpenBLAS for the cores (2-10x slower matrix products on two cores); OpenBLAS held to one
thread (as OPENBLAS_NUM_THREADS=1), interleaved in the same process; and both again in a child
process with OMP_WAIT_POLICY=passive (models with a native run only; --no-passive-eager skips
it). eager ms: the fastest sample (calls 2..N, or the alone samples where a model has them)
under the fastest setting, which "eager setting" names; dynamo ms: dynamo's fastest sample
(dynamo runs with the defaults); speedup: best eager / dynamo ms (>1 means dynamo is faster);
med ratio: eager's median (the lowest over its settings) / dynamo's median of the same samples
(shown beside it because single calls swing 2x on a small machine); 1st call ms: dynamo's first call (recording, compiling, running); compile ms: the
time spent compiling traces to native code over the whole run (dynamo.counters()'s
compile_seconds: every trace and side trace, recording excluded), "(N cached)" where N traces
were loaded from dynamo's disk cache instead (DYNAMO_CACHE_DIR=off times cold compiles).

At the end: the geomean speedup over the models that ran ok with a native run, overall and per
group (convolutional: the classification CNNs; transformer: vit_*, swin_*, maxvit_* and the nn
family; segmentation; detection; audio), and the models among them that dynamo makes slower.
--png writes a bar chart of those speedups (matplotlib; skipped with a note when it is missing).
The header says what eager runs with (perf/baseline.py's describe(): BLAS, allocator, threads).

Status: ok; WRONG (an output differs); LEAKED (dynamo raised, or the process died, where eager
did not); eager-fails (building the model or the eager call raised: nothing to compare);
skipped (over --timeout).

--mode hook calls the copy inside `with dynamo.optimize():` instead, so that the submodules'
forwards compile on their own where the whole forward cannot (counters and fallbacks then cover
every compiled frame).

Every model runs in its own child process (`--run-one NAME --family F`, which can be run by hand
to debug one model), so that a timeout or a crash costs only that model. The exit status is 1
when any model is WRONG or LEAKED. --json writes {"eager", "calls", "results", "geomean"}.

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/models.py \
        [--models resnet18,swin_t] [--family classification,detection,nn,audio] [--calls 8] \
        [--size 64] [--timeout 900] [--mode module|hook] [--json results.json] [--png zoo.png]
"""
import argparse
import copy
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping

FAMILIES = ("classification", "segmentation", "detection", "nn", "audio")
GROUPS = ("convolutional", "transformer", "segmentation", "detection", "audio")
TRANSFORMERS = ("vit_", "swin_", "maxvit_")  # the classification models that are no CNN
THREADS = 2  # torch's threads in every process of the zoo (eager and dynamo alike)
DEFAULT_CALLS = 8
FAMILY_CALLS = {"detection": 6}  # the slow family: fewer calls keep the whole zoo near 15 minutes
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchvision_ops  # noqa: E402  -- torchvision's nms where its C++ library cannot load

torchvision_ops.ensure()
RESULT_TAG = "@result "
PHASE_TAG = "@phase "


# ---------------------------------------------------------------------------------------------
# Which models, built how, at which input size


def _family_module(family):
    """The torchvision module whose registered builders form a family."""
    import torchvision.models as tvm
    return {"classification": tvm, "segmentation": tvm.segmentation, "detection": tvm.detection}[family]


def _wrappers():
    """One-input Modules around blocks that take several inputs or return a tuple (the zoo calls
    model(x)): SelfAttention, SelfDecode, OutputOnly, AllFrames."""
    import torch

    class OneInput(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

    class SelfAttention(OneInput):
        """MultiheadAttention's output for query, key and value x, without the weights."""
        def forward(self, x):
            return self.block(x, x, x, need_weights=False)[0]

    class SelfDecode(OneInput):
        """A decoder (or a whole Transformer) with x as both target and memory."""
        def forward(self, x):
            return self.block(x, x)

    class OutputOnly(OneInput):
        """The block's first output (an LSTM's output, not its state)."""
        def forward(self, x):
            return self.block(x)[0]

    class AllFrames(OneInput):
        """A block taking (input, lengths), every frame valid: the lengths are built in the call."""
        def forward(self, x):
            return self.block(x, torch.tensor([x.shape[1]]))[0]

    return SelfAttention, SelfDecode, OutputOnly, AllFrames


def _nn_blocks():
    """name -> (builder, input shape) for the nn family: torch.nn's attention and recurrent blocks."""
    import torch.nn as nn
    attend, decode, first, _ = _wrappers()
    layer = dict(d_model=256, nhead=8, dim_feedforward=1024, batch_first=True)
    small = dict(d_model=128, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=256,
                 batch_first=True)
    return {
        "nn.TransformerEncoderLayer": (lambda: nn.TransformerEncoderLayer(**layer), (1, 64, 256)),
        "nn.TransformerEncoder": (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), 2), (1, 64, 256)),
        "nn.TransformerDecoderLayer": (lambda: decode(nn.TransformerDecoderLayer(**layer)), (1, 64, 256)),
        "nn.MultiheadAttention": (lambda: attend(nn.MultiheadAttention(256, 8, batch_first=True)), (1, 64, 256)),
        "nn.LSTM": (lambda: first(nn.LSTM(64, 128, num_layers=2, batch_first=True)), (1, 32, 64)),
        "nn.Transformer": (lambda: decode(nn.Transformer(**small)), (1, 64, 128)),
    }


def _audio_models():
    """name -> (builder, input shape) for the audio family: torchaudio 0.13's models (random
    weights) and feature transforms."""
    import torchaudio
    m, t = torchaudio.models, torchaudio.transforms
    all_frames = _wrappers()[3]
    tasnet = dict(enc_num_feats=128, msk_num_feats=64, msk_num_hidden_feats=128, msk_num_layers=4, msk_num_stacks=2)
    conformer = dict(input_dim=80, num_heads=4, ffn_dim=128, num_layers=2, depthwise_conv_kernel_size=31)
    return {
        "torchaudio.Wav2Letter": (lambda: m.Wav2Letter(num_classes=40, input_type="waveform", num_features=1),
                                  (1, 1, 8000)),
        "torchaudio.DeepSpeech": (lambda: m.DeepSpeech(n_feature=64, n_class=40), (1, 1, 50, 64)),
        "torchaudio.ConvTasNet": (lambda: m.ConvTasNet(num_sources=2, **tasnet), (1, 1, 4000)),
        "torchaudio.wav2vec2_base": (m.wav2vec2_base, (1, 8000)),
        "torchaudio.Conformer": (lambda: all_frames(m.Conformer(**conformer)), (1, 100, 80)),
        "torchaudio.MelSpectrogram": (lambda: t.MelSpectrogram(sample_rate=16000, n_fft=400), (1, 16000)),
        "torchaudio.MFCC": (lambda: t.MFCC(sample_rate=16000), (1, 16000)),
    }


BLOCKS = {"nn": _nn_blocks, "audio": _audio_models}  # family -> its {name: (builder, input shape)}


def list_models(families=FAMILIES):
    """(name, family) for every model of the families: torchvision 0.14's registered builders,
    then the nn and audio families' own."""
    from torchvision.models import list_models as registered
    return [(name, fam) for fam in families
            for name in (BLOCKS[fam]() if fam in BLOCKS else registered(module=_family_module(fam)))]


def group_of(name, family):
    """The geomean group: convolutional, transformer, segmentation, detection or audio."""
    if family == "classification":
        return "transformer" if name.startswith(TRANSFORMERS) else "convolutional"
    return "transformer" if family == "nn" else family


def _maxvit_fits(s):
    """MaxViT's block inputs (stem stride 2, then 4 blocks of stride 2) divide its partition 7."""
    for _ in range(5):
        s = (s - 1) // 2 + 1
        if s % 7:
            return False
    return True


def _size_rule(name):
    """(predicate on the image side, why) for models that cannot take any size, else None."""
    if name == "inception_v3":
        return (lambda s: s >= 75), "inception_v3 needs >= 75x75"
    if name == "maxvit_t":
        return _maxvit_fits, "maxvit_t: every block input must divide by its partition size 7"
    if name.startswith("vit_"):
        patch = int(name.rsplit("_", 1)[1])
        return (lambda s: s % patch == 0), f"{name}: image_size must divide by its patch {patch}"
    return None


def model_size(name, size):
    """The smallest image side >= size that the model accepts, and a note when it is not size."""
    rule = _size_rule(name)
    if rule is None:
        return size, ""
    fits, why = rule
    s = size
    while not fits(s):
        s += 1
    return s, (f"{s}x{s} ({why})" if s != size else "")


def _detection_kwargs(name, size):
    """No score threshold (random weights score everything low: the outputs would be empty),
    and, but for SSD (fixed 300/320), the transform's size at the input's (it would resize
    to 800)."""
    if name.startswith("ssd"):
        return {"score_thresh": 0.0}
    thresh = "box_score_thresh" if "rcnn" in name else "score_thresh"
    return {thresh: 0.0, "min_size": size, "max_size": size}


def builder_kwargs(name, family, size):
    """Keyword arguments for a builder: random weights, nothing downloaded, sized for `size`."""
    kw = {"weights": None}
    if family != "classification":
        kw["weights_backbone"] = None  # the default would download ImageNet weights
    if family == "detection":
        kw.update(_detection_kwargs(name, size))
    if name in ("googlenet", "inception_v3"):
        kw.update(aux_logits=False, init_weights=True)
    if name.startswith("vit_"):
        kw["image_size"] = size
    if name == "maxvit_t":
        kw["input_size"] = (size, size)
    return kw


def family_note(name, family):
    """What the model does to its input that the table should say."""
    if family == "detection" and name.startswith("ssd"):
        return "resized to %s inside the model" % ("300x300" if name.startswith("ssd300") else "320x320")
    return ""


def _unzero(model):
    """Random values for weight matrices initialized to zeros (ViT's head): the output would
    be all zeros, and comparing zeros with zeros proves nothing."""
    import torch
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(std=0.02)
    return model


def model_input(name, family, size):
    """(image side or None, input shape, note): a batch of one image of the side the model takes
    (the smallest >= size), or an nn/audio model's own input shape."""
    if family in BLOCKS:
        return None, BLOCKS[family]()[name][1], ""
    side, note = model_size(name, size)
    return side, (1, 3, side, side), note or family_note(name, family)


def build_model(name, family, size):
    """The model in eval mode, with seeded random weights (none left all zero), built under
    no_grad: a weight derived at build time (wav2vec2's weight_norm) is then no autograd
    result, which copy.deepcopy refuses."""
    import torch
    from torchvision.models import get_model_builder
    torch.manual_seed(0)
    with torch.no_grad():
        if family in BLOCKS:
            model = BLOCKS[family]()[name][0]()
        else:
            model = get_model_builder(name)(**builder_kwargs(name, family, size))
            if family == "detection":
                _spread_scores(model, size)
    return _unzero(model).eval()


# torchvision draws a detection model's score layers (objectness, class logits) with std 0.01:
# over a random backbone every score is then about the same (Faster R-CNN: 1/91 +- 1e-4 over 1,000
# boxes; RetinaNet's sigmoid saturates at 1.0), top-k and NMS choose among near-ties, and a
# last-bit difference of the products (1e-8) picks other boxes: a comparison would test rounding.


def _score_layers(model):
    """The layers whose outputs rank the boxes: the last convolution or linear layer of each
    objectness / classification head."""
    import torch
    found = []
    for name, m in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in ("cls_logits", "cls_score"):
            found.append(m)
        elif name.rsplit(".", 2)[0].endswith("classification_head.module_list") and last.isdigit():
            convs = [c for c in m.modules() if isinstance(c, (torch.nn.Conv2d, torch.nn.Linear))]
            found.append(convs[-1])  # SSD: per feature map, a conv (or a depthwise block, then one)
    return found


def _spread_scores(model, size):
    """Rescales each score layer so that its outputs have std 1 around 0 on an image of the
    zoo's size: most scores then differ by far more than rounding. The ties that remain
    (proposals pooling the same features) are judged by _rounding_budget."""
    import torch
    stds = {}
    hooks = [m.register_forward_hook(lambda m, i, o: stds.setdefault(m, []).append(o.float().std().item()))
             for m in _score_layers(model)]
    try:
        with torch.no_grad():
            model.eval()(make_input("detection", (1, 3, size, size), 12345))
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        for m, seen in stds.items():
            s = max(seen)
            if s > 0:
                m.weight.mul_(1.0 / s)
            if m.bias is not None:
                m.bias.zero_()
    return model


def make_input(family, shape, seed):
    """One call's input, the same for a seed: a list of one image in [0, 1] (detection), else a
    standard normal tensor of the shape (images, sequences, waveforms, features)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    if family == "detection":
        return [torch.rand(*shape[1:], generator=gen)]
    return torch.randn(*shape, generator=gen)


def clone_input(x):
    """A copy a model may write into without touching the other side's input."""
    return [t.clone() for t in x] if isinstance(x, list) else x.clone()


# ---------------------------------------------------------------------------------------------
# Comparing outputs


class Mismatch(Exception):
    """The two outputs differ in structure, shape, dtype or value (message says where)."""


def _leaves(v, path="out"):
    """(path, leaf) for every non-container leaf of a nested output."""
    if isinstance(v, Mapping):
        for k, x in v.items():
            yield from _leaves(x, f"{path}[{k!r}]")
    elif isinstance(v, (tuple, list)):
        for i, x in enumerate(v):
            yield from _leaves(x, f"{path}[{i}]")
    else:
        yield path, v


def _structure(v):
    """The container skeleton of an output (types, keys, lengths), leaves erased."""
    if isinstance(v, Mapping):
        return ("dict", tuple(v.keys()), tuple(_structure(x) for x in v.values()))
    if isinstance(v, (tuple, list)):
        return ("seq", tuple(_structure(x) for x in v))
    return "leaf"


def _compare_tensor(path, want, got, rtol, atol_rel):
    """(max abs error, max |want|) of two tensors; raises Mismatch when not close."""
    import torch
    if got.shape != want.shape or got.dtype != want.dtype:
        raise Mismatch(f"{path}: {tuple(got.shape)} {got.dtype} vs eager {tuple(want.shape)} {want.dtype}")
    if want.numel() == 0:
        return 0.0, 0.0
    if not want.is_floating_point():
        if not torch.equal(got, want):
            raise Mismatch(f"{path}: {int((got != want).sum())} of {want.numel()} elements differ")
        return 0.0, 0.0  # labels, indices, masks: exact, and no part of the output scale
    w, g = want.double(), got.double()
    both_nan = w.isnan() & g.isnan()
    scale = float(w.abs().nan_to_num(0.0, 0.0, 0.0).max())
    err = float((g - w).abs().masked_fill(both_nan, 0.0).nan_to_num(math.inf).max())
    if not torch.allclose(g, w, rtol=rtol, atol=atol_rel * scale, equal_nan=True):
        raise Mismatch(f"{path}: max abs error {err:.3g} at output scale {scale:.3g}", err, scale)
    return err, scale


def _tied_order(want, got, tol=1e-5):
    """got (a detection dict: boxes, scores, labels, maybe masks/keypoints) with its rows put in
    want's order where the two differ only among detections whose scores tie to within float
    rounding (tol, relative): sorting near-equal scores computed with other rounding (fused
    kernels, another thread count) may swap them. Rows are matched within each run of tied
    scores by label and nearest box; got is returned unchanged when no such matching exists."""
    import torch
    ws, gs = want.get("scores"), got.get("scores")
    if not (isinstance(ws, torch.Tensor) and isinstance(gs, torch.Tensor) and ws.dim() == 1 and
            ws.shape == gs.shape and isinstance(want.get("boxes"), torch.Tensor) and
            isinstance(got.get("boxes"), torch.Tensor) and want["boxes"].shape == got["boxes"].shape):
        return got
    n = ws.numel()
    if n < 2 or not torch.allclose(gs.double(), ws.double(), rtol=tol, atol=tol):
        return got
    wl, gl = want.get("labels"), got.get("labels")
    wb, gb = want["boxes"].double(), got["boxes"].double()
    perm, i = list(range(n)), 0
    while i < n:  # a run [i, j) of scores tied with its first
        j = i + 1
        while j < n and abs(float(ws[j]) - float(ws[i])) <= tol * max(1.0, abs(float(ws[i]))):
            j += 1
        free = list(range(i, j))
        for r in range(i, j):
            same = [c for c in free if wl is None or gl is None or int(gl[c]) == int(wl[r])]
            if not same:
                return got
            best = min(same, key=lambda c: float((gb[c] - wb[r]).abs().max()))
            perm[r] = best
            free.remove(best)
        i = j
    index = torch.tensor(perm)
    return {k: (v[index] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n else v)
            for k, v in got.items()}


def _align_detections(want, got):
    """Detection outputs (lists of dicts with boxes and scores) with tied rows aligned."""
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)) and len(want) == len(got):
        return type(got)(_tied_order(w, g) if isinstance(w, Mapping) and isinstance(g, Mapping) else g
                         for w, g in zip(want, got))
    return got


def compare(want, got, rtol=1e-3, atol_rel=1e-3):
    """(max abs error, max |want|) over every leaf; raises Mismatch at the first difference
    (its args carry the error and scale when the values, not the structure, differ). Detections
    whose scores tie to within rounding may come in either order (_tied_order)."""
    import torch
    got = _align_detections(want, got)
    if _structure(want) != _structure(got):
        raise Mismatch(f"output structure differs: {_structure(got)} vs eager {_structure(want)}")
    err = scale = 0.0
    for (path, w), (_, g) in zip(_leaves(want), _leaves(got)):
        if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor):
            e, s = _compare_tensor(path, w, g, rtol, atol_rel)
            err, scale = max(err, e), max(scale, s)
        elif type(w) is not type(g) or w != g:
            raise Mismatch(f"{path}: {g!r} vs eager {w!r}")
    return err, scale


# ---------------------------------------------------------------------------------------------
# One model (the child process)


def _phase(text):
    """Tells the parent where the child is (what a timeout or crash interrupted)."""
    print(PHASE_TAG + text, flush=True)


def first_fallback(report_text):
    """The first 'fell back' / 'not compiled' reason in dynamo.report(), or ''."""
    for line in report_text.splitlines():
        line = line.strip()
        for tag in ("fell back: ", "not compiled: "):
            if line.startswith(tag):
                return line[len(tag):]
    return ""


def _under_hook(model):
    """model called inside `with dynamo.optimize():`: every frame it starts is a candidate, so
    submodules compile on their own where the whole forward cannot."""
    import dynamo

    def call(x):
        with dynamo.optimize():
            return model(x)
    return call


def _timed(fn, x):
    """(result, seconds) of fn(x)."""
    t0 = time.perf_counter()
    out = fn(x)
    return out, time.perf_counter() - t0


# A call shorter than SAMPLE_S is timed as the mean of back-to-back calls (as timeit's autorange):
# one sub-millisecond call is mostly timer and scheduler noise, and its fastest of 7 calls a
# lottery. The number of calls per sample comes from eager's second call (its fastest setting) and
# is the same on both sides (and in the passive-threads child); dynamo's first call (its
# recording) is never repeated.
SAMPLE_S = 0.02
MAX_REPEAT = 50
# Models whose first eager call takes under ALONE_BELOW_S are also timed with each side alone
# (ModelRun._alone), ALONE_SAMPLES samples per side; those samples are the ones compared.
ALONE_BELOW_S = 1.5
ALONE_SAMPLES = 6


def repeats_for(first_eager_s):
    """Calls per timed sample for a model whose first eager call took first_eager_s."""
    if not first_eager_s or first_eager_s >= SAMPLE_S:
        return 1
    return max(1, min(MAX_REPEAT, int(SAMPLE_S / first_eager_s)))


def _sampled(fn, x, repeat):
    """(result of the first call, mean seconds per call over `repeat` calls), each call on its
    own clone of x (cloned outside the timed part)."""
    out, total = _timed(fn, clone_input(x))
    for _ in range(repeat - 1):
        total += _timed(fn, clone_input(x))[1]
    return out, total / repeat


# The eager settings a user can pick, each timed per model: the keys of a result's per-call
# seconds under each, and the names the table gives them. "spin": GNU OpenMP's default (threads
# spin after each parallel region) with OpenBLAS's own threads; "1-thread BLAS": OpenBLAS held to
# one thread (as OPENBLAS_NUM_THREADS=1), so that its products do not fight the spinning OpenMP
# threads; "passive": OMP_WAIT_POLICY=passive (timed in a child process).
EAGER_SETTINGS = (("eager_s", "spin"), ("eager_blas1_s", "1-thread BLAS"), ("eager_passive_s", "passive"),
                  ("eager_passive_blas1_s", "passive, 1-thread BLAS"))


def timing(eager_s, dynamo_s, settings=None, alone=None):
    """The times the table shows, from each side's per-call seconds: best and median of calls
    2..N (call 1 records and compiles), speedup (eager best / dynamo best) and median ratio
    (eager median / dynamo median), both >1 where dynamo is faster, and dynamo's first call.
    settings: {EAGER_SETTINGS key: per-call seconds} of eager's other settings; the baseline is
    the setting with the fastest call (eager_setting names it; the median is the lowest of the
    settings' medians). alone: {key: seconds per sample} timed with each side alone
    (ModelRun._alone): those samples, all of them, stand for calls 2..N of the sides they have.
    None where there are too few calls."""
    alone = alone or {}
    d = alone.get("dynamo_s") or dynamo_s[1:]
    runs = {"eager_s": eager_s, **(settings or {})}
    t = dict(eager_best=None, dynamo_best=None, eager_median=None, dynamo_median=None, speedup=None,
             median_ratio=None, first_call_s=dynamo_s[0] if dynamo_s else None, eager_setting=None,
             eager_by_setting={})
    names = dict(EAGER_SETTINGS)
    for key, times in runs.items():
        later = alone.get(key) or times[1:]
        if later:
            t["eager_by_setting"][names[key]] = (min(later), statistics.median(later))
    if t["eager_by_setting"] and d:
        name, (best, _) = min(t["eager_by_setting"].items(), key=lambda kv: kv[1][0])
        t.update(eager_best=best, eager_setting=name, dynamo_best=min(d), dynamo_median=statistics.median(d),
                 eager_median=min(m for _, m in t["eager_by_setting"].values()))
        t.update(speedup=t["eager_best"] / t["dynamo_best"], median_ratio=t["eager_median"] / t["dynamo_median"])
    return t


class ModelRun:
    """Eager and dynamo side by side on one model; fills a result dict as it goes."""

    def __init__(self, name, family, size, calls, mode="module"):
        self.size, self.shape, note = model_input(name, family, size)
        self.family, self.calls, self.mode = family, calls, mode
        self.repeat = 1  # calls per timed sample after the first (repeats_for)
        self.dynamo_calls = 0  # calls of the optimized model (timed repeats included)
        self.r = dict(name=name, family=family, group=group_of(name, family), size=self.size, shape=self.shape,
                      note=note, status="ok", reason="", traceback="", max_err=0.0, max_abs=0.0, calls_done=0,
                      eager_s=[], eager_blas1_s=[], dynamo_s=[])

    def _fail(self, status, reason, tb=""):
        self.r.update(status=status, reason=reason, traceback=tb)

    def _build(self):
        """(eager model, optimized copy), or None after recording eager-fails."""
        import dynamo
        _phase("building the model")
        try:
            eager = build_model(self.r["name"], self.family, self.size)
        except Exception as e:  # noqa: BLE001 -- any builder failure is the model's, not ours
            self._fail("eager-fails", f"build: {type(e).__name__}: {e}", traceback.format_exc())
            return None
        jit = copy.deepcopy(eager)
        return eager, (dynamo.optimize(jit) if self.mode == "module" else _under_hook(jit))

    def _side(self, k, which, fn, x):
        """((output, seconds), None) of one side's call k, or (None, (reason, traceback))."""
        _phase(f"{which} call {k + 1}" + (" (recording and compiling)" if which == "dynamo" and k == 0 else ""))
        try:
            if which == "dynamo":
                self.dynamo_calls += self.repeat if k else 1
            return _sampled(fn, x, self.repeat if k else 1), None
        except Exception as e:  # noqa: BLE001 -- whatever the model raises is the finding
            return None, (f"{which} call {k + 1}: {type(e).__name__}: {e}", traceback.format_exc())

    def _one_call(self, k, eager, jit):
        """Call k on both sides with one input, and eager again with OpenBLAS on one thread (the
        order rotates, so that no side always runs on a warm cache); False when the run must
        stop: eager raised (eager-fails), or dynamo raised where eager did not (LEAKED)."""
        x = make_input(self.family, self.shape, seed=1000 + k)
        order = [("eager", eager), ("dynamo", jit)]
        if openblas_threads.available():
            order.append(("eager with 1-thread BLAS", lambda v: _with_blas1(eager, v)))
        order = order[k % len(order):] + order[:k % len(order)]
        done = dict((which, self._side(k, which, fn, x)) for which, fn in order)
        (e, e_fail), (j, j_fail) = done["eager"], done["dynamo"]
        if e_fail:
            self._fail("eager-fails", *e_fail)
        elif j_fail:
            self._fail("LEAKED", *j_fail)
        else:
            e1 = done.get("eager with 1-thread BLAS", (None, None))[0]
            self._account(k, e[0], j[0], e[1], j[1], e1[1] if e1 else None,
                          lambda: _rounding_budget(eager, x, e[0]))
        return not (e_fail or j_fail)

    def _account(self, k, want, got, te, tj, te1=None, rounding_budget=None):
        """Compares call k's outputs and keeps the error, scale and times. A detection model's
        mismatch is held to what eager's own output does under rounding-sized noise
        (rounding_budget(): how many boxes eager then puts elsewhere): the same number of
        detections per image, and no more of them elsewhere than that; such a call is noted."""
        r = self.r
        r["calls_done"] = k + 1
        if k < 2:  # from call 1 (cold), then from call 2: the fastest eager setting's call
            self.repeat = r["repeat"] = repeats_for(min(te, te1 if te1 is not None else te))
        r["eager_s"].append(te)
        r["dynamo_s"].append(tj)
        if te1 is not None:
            r["eager_blas1_s"].append(te1)
        try:
            err, scale = compare(want, got)
        except Mismatch as m:
            err, scale = (m.args[1], m.args[2]) if len(m.args) == 3 else (math.inf, 0.0)
            moved = _unmatched(got, want) if self.family == "detection" and rounding_budget is not None else None
            budget = rounding_budget() if moved is not None else 0
            if moved is not None and 0 < budget and moved <= budget:
                err, scale = 0.0, 0.0
                if "rounding-sized noise" not in r["note"]:
                    r["note"] = (r["note"] + "; " if r["note"] else "") + \
                        f"call {k + 1}: {moved} of the boxes differ ({m.args[0]}), where eager given " \
                        f"rounding-sized noise moves up to {budget} (tied scores)"
            elif r["status"] == "ok":
                self._fail("WRONG", f"call {k + 1}: {m.args[0]}")
        r["max_err"], r["max_abs"] = max(r["max_err"], err), max(r["max_abs"], scale)

    def run(self):
        """Builds, calls both sides, and returns the result dict with the times and dynamo's
        counters."""
        import dynamo
        import torch
        dynamo.reset()
        before = dynamo.counters()
        models = self._build()
        if models is not None:
            with torch.no_grad():
                for k in range(self.calls):
                    if not self._one_call(k, *models):
                        break
                if self.r["status"] == "ok" and self.r["eager_s"] and self.r["eager_s"][0] < ALONE_BELOW_S:
                    self._alone(*models)
        after = dynamo.counters()
        self.r["counters"] = {k: after[k] - before[k] for k in after}
        self.r["fallback"] = first_fallback(dynamo.report())
        self.r["dynamo_calls"] = self.dynamo_calls
        self.r.update(timing(self.r["eager_s"], self.r["dynamo_s"], {"eager_blas1_s": self.r["eager_blas1_s"]},
                             self.r.get("alone")))
        return self.r

    def _alone(self, eager, jit):
        """After the checked calls: ALONE_SAMPLES samples of each side timed back to back with no
        other side in between (dynamo first, then eager and eager with 1-thread BLAS, a pause
        before each), as a program runs one or the other: interleaved, each side's calls start
        while the other's threads still spin (OpenBLAS's for up to ~0.1 s after a product, GNU
        OpenMP's after each parallel region), which costs whichever runs next 10-20%."""
        x = make_input(self.family, self.shape, seed=2000)
        blocks = [("dynamo_s", jit), ("eager_s", eager)]
        if openblas_threads.available():
            blocks.append(("eager_blas1_s", lambda v: _with_blas1(eager, v)))
        alone = {}
        try:
            for key, fn in blocks:
                _phase(f"timing {key[:-2]} alone")
                time.sleep(0.2)
                alone[key] = [_sampled(fn, x, self.repeat)[1] for _ in range(ALONE_SAMPLES)]
                if key == "dynamo_s":
                    self.dynamo_calls += ALONE_SAMPLES * self.repeat
        except Exception:  # noqa: BLE001 -- the checked calls passed; the interleaved times stand
            return
        self.r["alone"] = alone


def _unmatched(a, b):
    """Detections of output a (a list of per-image dicts with boxes, labels, scores) that b has
    no detection for with the same label, a box within 0.01 pixels and the score within 1e-4, and
    whose other fields (masks, keypoints) are those of that detection (the zoo's tolerance);
    None where the images have different numbers of detections or the outputs are no detection
    lists."""
    import torch
    try:
        n = 0
        for da, db in zip(a, b, strict=True):
            ba, bb = da["boxes"].float(), db["boxes"].float()
            if len(ba) != len(bb):
                return None
            if not len(ba):
                continue
            # label and score as more coordinates: a match has both (scores to 1e-4)
            fa = [ba, da["labels"].float()[:, None] * 1e4, da["scores"].float()[:, None] * 100]
            fb = [bb, db["labels"].float()[:, None] * 1e4, db["scores"].float()[:, None] * 100]
            dist, j = torch.cdist(torch.cat(fa, 1), torch.cat(fb, 1)).min(1)
            ok = dist <= 1e-2
            for key in da.keys() - {"boxes", "labels", "scores"}:  # masks, keypoints: of the matched box
                xa, xb = da[key], db[key][j]
                tol = 1e-3 * max(float(db[key].abs().max()), 1e-30) if db[key].numel() else 0.0
                ok &= ((xa - xb).abs() <= tol + 1e-3 * xb.abs()).flatten(1).all(1)
            n += int((~ok).sum())
        return n
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _rounding_budget(eager, x, want):
    """How many of a detection model's boxes at input x hang on rounding: the most detections
    that eager itself puts elsewhere when its input, or its score layers' outputs, get relative
    noise of 1e-6 (far above a compiled model's rounding, 1e-13..1e-8 here), over six such runs;
    0 for a well-conditioned output. Random weights over a 64x64 image make many proposals pool
    the same features: their scores tie exactly or to 1e-7, which of them top-k and NMS keep is
    the last bit's (any other summation order, such as a compiled GEMM's row blocks, changes it),
    and NMS cascades a different pick into other boxes kept or suppressed."""
    import torch
    budget = 0
    for seed in (7, 8, 9):
        gen = torch.Generator().manual_seed(seed)

        def noise(t):
            return t * (1 + 1e-6 * torch.randn(t.shape, generator=gen))
        runs = [lambda: eager([noise(t) for t in x])]
        hooks = []

        def on_scores():  # the scores rounded differently, row by row (rows a GEMM computes apart)
            hooks.extend(m.register_forward_hook(lambda m, i, o: noise(o)) for m in _score_layers(eager))
            try:
                return eager(clone_input(x))
            finally:
                for h in hooks:
                    h.remove()
                hooks.clear()
        runs.append(on_scores)
        for run in runs:
            n = _unmatched(run(), want)
            budget = max(budget, n if n is not None else 0)
    return budget


def setup_torch():
    """What every process of the zoo runs torch with: THREADS threads, warnings off."""
    import warnings
    import torch
    warnings.filterwarnings("ignore")
    torch.set_num_threads(THREADS)


def _with_blas1(model, x):
    with openblas_threads(1):
        return model(x)


def _perf_dir_on_path():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)


_perf_dir_on_path()
from baseline import openblas_threads  # noqa: E402  -- perf/baseline.py, beside this file


def eager_baseline():
    """perf/baseline.py's describe() (BLAS, allocator, threads) of this process, whichever
    directory it was started from."""
    from baseline import describe
    return describe()


def run_one(name, family, size, calls, mode):
    """The child's work: one model, its result printed as one tagged JSON line."""
    setup_torch()
    print(RESULT_TAG + json.dumps(ModelRun(name, family, size, calls, mode).run()), flush=True)


def run_eager_only(name, family, size, calls, repeat=1):
    """A child that runs only the eager side (same inputs), with OpenBLAS's threads and with one
    (alternating which goes first), calls after the first timed as the parent's were (repeat
    calls per sample): {"eager_s": [...], "eager_blas1_s": [...]} as a tagged line."""
    import torch
    setup_torch()
    run = ModelRun(name, family, size, calls)
    model = build_model(name, family, run.size)
    times = {"eager_s": [], "eager_blas1_s": []}
    sides = [("eager_s", model), ("eager_blas1_s", lambda v: _with_blas1(model, v))]
    with torch.no_grad():
        for k in range(calls):
            x = make_input(family, run.shape, seed=1000 + k)
            for key, fn in (sides[::-1] if k % 2 else sides):
                times[key].append(_sampled(fn, x, repeat if k else 1)[1])
    if not openblas_threads.available():
        times["eager_blas1_s"] = []
    print(RESULT_TAG + json.dumps(times), flush=True)


# ---------------------------------------------------------------------------------------------
# The parent: one child per model, the table


def _last_phase(stdout):
    """The last phase line a child printed, or 'starting'."""
    phases = [ln[len(PHASE_TAG):] for ln in (stdout or "").splitlines() if ln.startswith(PHASE_TAG)]
    return phases[-1] if phases else "starting"


def _empty_result(name, family, size, status, reason, tb=""):
    """A result for a model whose child gave none (timeout, crash)."""
    side, shape, note = model_input(name, family, size)
    return dict(name=name, family=family, group=group_of(name, family), size=side, shape=shape, note=note,
                status=status, reason=reason, traceback=tb, max_err=None, max_abs=None, calls_done=0, counters={},
                fallback="", eager_s=[], dynamo_s=[], **timing([], []))


def _signal_name(rc):
    """'SIGSEGV' for a child killed by signal 11, else 'exit status N'."""
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _crash_result(name, family, size, rc, stdout, stderr):
    """A child that ended without a result: LEAKED when it died inside a dynamo call."""
    phase = _last_phase(stdout)
    status = "LEAKED" if phase.startswith("dynamo") else "eager-fails"
    return _empty_result(name, family, size, status, f"process died ({_signal_name(rc)}) in {phase}",
                         (stderr or "")[-4000:])


def calls_for(family, calls):
    """Calls per model: --calls, else the family's default (FAMILY_CALLS, else DEFAULT_CALLS)."""
    return calls or FAMILY_CALLS.get(family, DEFAULT_CALLS)


# OpenMP threads of eager PyTorch spin after each parallel region (GNU OpenMP's default); a
# threaded OpenBLAS then fights them for the cores, which on a small machine makes eager's matrix
# products 2-10x slower. OMP_WAIT_POLICY=passive avoids that for eager (and costs the JIT, whose
# kernels are many short parallel regions): a user can set it, so eager is also timed with it.
PASSIVE_ENV = {"OMP_WAIT_POLICY": "passive"}


def eager_with_passive_threads(r, args):
    """Times the eager side again in a child with OMP_WAIT_POLICY=passive (with OpenBLAS's
    threads and with one) and makes the best of every eager setting the baseline of r's speedup
    and median ratio."""
    cmd = [sys.executable, os.path.abspath(__file__), "--eager-only", r["name"], "--family", r["family"],
           "--size", str(args.size), "--calls", str(calls_for(r["family"], args.calls)),
           "--repeat", str(r.get("repeat", 1))]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout or None,
                           env=dict(os.environ, **PASSIVE_ENV))
    except subprocess.TimeoutExpired:
        return
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if not lines:
        return
    child = json.loads(lines[-1][len(RESULT_TAG):])
    r["eager_passive_s"], r["eager_passive_blas1_s"] = child["eager_s"], child.get("eager_blas1_s", [])
    r.update(timing(r["eager_s"], r["dynamo_s"], {k: r.get(k, []) for k, _ in EAGER_SETTINGS[1:]},
                    r.get("alone")))


def run_isolated(name, family, args):
    """Runs one model in a child process under args.timeout; returns its result dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--run-one", name, "--family", family,
           "--size", str(args.size), "--calls", str(calls_for(family, args.calls)), "--mode", args.mode]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout or None)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout
        r = _empty_result(name, family, args.size, "skipped",
                          f"over the {args.timeout:g} s timeout in {_last_phase(out)}")
    else:
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_TAG)]
        r = json.loads(lines[-1][len(RESULT_TAG):]) if lines else \
            _crash_result(name, family, args.size, p.returncode, p.stdout, p.stderr)
        if args.passive_eager and r["status"] == "ok" and r.get("speedup") and \
                (r.get("counters") or {}).get("native_runs", 0) > 0:
            eager_with_passive_threads(r, args)
        if "native call path is unavailable" in (p.stderr or ""):
            # (dynamo said so on the child's stderr, which the table does not show)
            r["note"] = (r["note"] + "; " if r["note"] else "") + \
                "dynamo ran without its native call path (_fastcall not built): its times are not representative"
            print("zoo: warning: dynamo's native call path (build/python/_fastcall*.so) is missing; "
                  "dynamo's times are milliseconds per call too slow", file=sys.stderr)
    r["wall_s"] = time.perf_counter() - t0
    return r


def _fmt(v, spec=".2g"):
    return "-" if v is None else format(v, spec)


def _ms(seconds):
    """Milliseconds, 3 figures or so: '0.42', '12.3', '145'."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _x(ratio):
    return "-" if ratio is None else f"{ratio:.2f}x"


def _compile_ms(c):
    """The compile time, and how many traces came from the disk cache: '20.6 (1 cached)'."""
    hits = c.get("cache_hits", 0)
    return _ms(c.get("compile_seconds")) + (f" ({hits} cached)" if hits else "")


def _native(r):
    """Native runs / calls of the optimized model (timed repeats included; a model compiled in
    parts has a run per part that ran natively)."""
    c = r.get("counters") or {}
    return f"{c.get('native_runs', 0)}/{r.get('dynamo_calls') or r['calls_done']}" if c else "-"


def _why(r):
    """The table's reason column: a failure's reason, else the first fallback (or guard misses)."""
    if r["status"] != "ok":
        return r["reason"]
    if r.get("fallback"):
        return "fallback: " + r["fallback"]
    misses = (r.get("counters") or {}).get("guard_misses", 0)
    return f"{misses} guard miss(es)" if misses else ""


COLUMNS = ("model", "input", "status", "max err", "max |out|", "native", "traces", "eager ms", "eager setting",
           "dynamo ms", "speedup", "med ratio", "1st call ms", "compile ms", "reason / first fallback")


def table_row(r, width=90):
    """One row of the results table (the reason cut to width)."""
    c = r.get("counters") or {}
    traces = f"{c.get('traces_compiled', 0)}+{c.get('side_traces_compiled', 0)}" if c else "-"
    why = _why(r).replace("\n", " ")
    why = why if len(why) <= width else why[:width - 3] + "..."
    return (r["name"], "x".join(map(str, r["shape"])), r["status"], _fmt(r.get("max_err")), _fmt(r.get("max_abs")),
            _native(r), traces, _ms(r["eager_best"]), r.get("eager_setting") or "-",
            _ms(r["dynamo_best"]), _x(r["speedup"]),
            _x(r["median_ratio"]), _ms(r["first_call_s"]), _compile_ms(c), why)


def print_table(results, out=sys.stdout):
    """The results table, columns padded to their widest cell."""
    rows = [COLUMNS] + [table_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)


def progress_line(i, n, r):
    """The line printed as a model finishes."""
    name, _, status, err, scale, native, traces, eager, setting, jit, speedup, *_, why = table_row(r, width=120)
    return (f"[{i:>3}/{n}] {name:<36} {status:<11} err {err:<8} |out| {scale:<8} native {native:<5} "
            f"traces {traces:<5} eager {eager:>6} ms ({setting:<22})  dynamo {jit:>6} ms {speedup:>7}  "
            f"{r['wall_s']:6.1f} s  {why}")


def summary_line(results):
    """zoo: N models, ok X, WRONG Y, LEAKED Z, native in W (W: models with a native run)."""
    count = lambda s: sum(r["status"] == s for r in results)  # noqa: E731
    native = sum((r.get("counters") or {}).get("native_runs", 0) > 0 for r in results)
    extra = "".join(f", {s} {count(s)}" for s in ("eager-fails", "skipped") if count(s))
    return (f"zoo: {len(results)} models, ok {count('ok')}, WRONG {count('WRONG')}, LEAKED {count('LEAKED')}, "
            f"native in {native}{extra}")


def _timed_natively(results):
    """The models the geomean covers: ok, with a native run and a speedup."""
    return [r for r in results if r["status"] == "ok" and r["speedup"] is not None
            and (r.get("counters") or {}).get("native_runs", 0) > 0]


def _geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def geomeans(results):
    """{'all' and each group: (geomean speedup or None, models)} over the models timed natively."""
    timed = _timed_natively(results)
    speedups = lambda g: [r["speedup"] for r in timed if g in ("all", r["group"])]  # noqa: E731
    return {g: (_geomean(speedups(g)), len(speedups(g))) for g in ("all",) + GROUPS}


def geomean_lines(results):
    """The geomean speedups (overall and per group) and the models dynamo makes slower."""
    geo = ", ".join(f"{g} {_x(m)} ({n})" for g, (m, n) in geomeans(results).items())
    timed = _timed_natively(results)
    slower = sorted((r for r in timed if r["speedup"] < 1.0), key=lambda r: r["speedup"])
    names = ", ".join(f"{r['name']} {_x(r['speedup'])}" for r in slower)
    return [f"geomean speedup over the models ok with a native run (models): {geo}",
            f"slower than eager: {len(slower)} of {len(timed)}" + (f": {names}" if slower else "")]


def print_notes(results, out=sys.stdout):
    """Models run at another size than asked, or that resize internally."""
    notes = [f"  {r['name']}: {r['note']}" for r in results if r.get("note")]
    if notes:
        print("\nnotes:", *notes, sep="\n", file=out)


def print_failures(results, out=sys.stdout):
    """Every WRONG / LEAKED model with its reason and traceback."""
    for r in results:
        if r["status"] in ("WRONG", "LEAKED"):
            print(f"\n== {r['name']}: {r['status']}: {r['reason']}", file=out)
            if r.get("traceback"):
                print(r["traceback"].rstrip(), file=out)


GROUP_COLOURS = dict(zip(GROUPS, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))


def _draw_speedups(ax, rows):
    """One horizontal bar per result, from 1.0 to its speedup on a log axis, coloured by group."""
    from matplotlib.patches import Patch
    speedups = [r["speedup"] for r in rows]
    lo, hi = min(speedups + [1.0]) / 1.2, max(speedups + [1.0]) * 1.2
    ticks = [2.0 ** k for k in range(-6, 7) if lo <= 2.0 ** k <= hi]
    ax.barh(range(len(rows)), [v - 1.0 for v in speedups], left=1.0, color=[GROUP_COLOURS[r["group"]] for r in rows])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r["name"] for r in rows], fontsize=7)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup: eager best / dynamo best (> 1: dynamo is faster)")
    present = [g for g in GROUPS if any(r["group"] == g for r in rows)]
    ax.legend(handles=[Patch(color=GROUP_COLOURS[g], label=g) for g in present], loc="lower right", fontsize=8)


def write_chart(path, results, eager):
    """The speedups of the models timed natively as a bar chart, sorted, slowest at the bottom;
    the title has the date, the eager baseline and the geomean."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("zoo: no chart: matplotlib is missing (apt-get install python3-matplotlib)")
        return
    rows = sorted(_timed_natively(results), key=lambda r: r["speedup"])
    if not rows:
        print("zoo: no chart: no model ran ok with a native run")
        return
    mean, n = geomeans(results)["all"]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.16 * len(rows)))
    _draw_speedups(ax, rows)
    ax.set_title(f"dynamo model zoo, {time.strftime('%Y-%m-%d')}: geomean {_x(mean)} over {n} models\n"
                 f"eager: {eager};\nthe fastest of OpenBLAS's threads or one, spinning or passive OpenMP threads",
                 fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"zoo: chart in {path}")


def write_json(path, eager, calls, results):
    """Every result (full reasons, tracebacks, per-call seconds), the baseline, the calls per
    family and the geomeans."""
    geo = {g: dict(speedup=m, models=n) for g, (m, n) in geomeans(results).items()}
    with open(path, "w") as f:
        json.dump(dict(eager=eager, calls=calls, results=results, geomean=geo), f, indent=1)


def select(args):
    """The (name, family) pairs to run, in registry order, filtered by --models / --family."""
    families = [f for f in args.family.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            sys.exit(f"models.py: unknown family {f!r} (have {', '.join(FAMILIES)})")
    chosen = list_models(families)
    if args.models:
        wanted = [m for m in args.models.split(",") if m]
        known = dict(list_models())
        unknown = [m for m in wanted if m not in known]
        if unknown:
            sys.exit(f"models.py: unknown model(s) {', '.join(unknown)}")
        chosen = [(m, known[m]) for m in wanted]
    return chosen


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated model names (default: all of --family)")
    p.add_argument("--family", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES))
    p.add_argument("--calls", type=int, default=0,
                   help=f"calls per model, each with a fresh input (default {DEFAULT_CALLS}; "
                        + ", ".join(f"{f} {n}" for f, n in FAMILY_CALLS.items()) + ")")
    p.add_argument("--size", type=int, default=64, help="image side (default 64; larger where a model needs it)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per model before it is skipped "
                                                              "(default 900; 0: none)")
    p.add_argument("--mode", choices=("module", "hook"), default="module",
                   help="module: dynamo.optimize(model) (default); hook: the call runs inside "
                        "`with dynamo.optimize():`, so submodules compile where the forward cannot")
    p.add_argument("--json", default="", help="also write every result (full reasons, tracebacks) here")
    p.add_argument("--png", default="", help="also draw the speedups here (default: no chart)")
    p.add_argument("--no-passive-eager", dest="passive_eager", action="store_false",
                   help="do not time eager again with OMP_WAIT_POLICY=passive")
    p.add_argument("--run-one", default="", help=argparse.SUPPRESS)  # the child process
    p.add_argument("--eager-only", default="", help=argparse.SUPPRESS)  # the passive-threads child
    p.add_argument("--repeat", type=int, default=1, help=argparse.SUPPRESS)  # ... its calls per sample
    return p.parse_args(argv)


def _calls_text(calls):
    """'8 calls each' with --calls, else the defaults: '8 calls each (detection 4)'."""
    if calls:
        return f"{calls} calls each"
    return f"{DEFAULT_CALLS} calls each (" + ", ".join(f"{f} {n}" for f, n in FAMILY_CALLS.items()) + ")"


def main(argv=None):
    args = parse_args(argv)
    if args.run_one:
        run_one(args.run_one, args.family, args.size, calls_for(args.family, args.calls), args.mode)
        return 0
    if args.eager_only:
        run_eager_only(args.eager_only, args.family, args.size, calls_for(args.family, args.calls), args.repeat)
        return 0
    chosen = select(args)
    setup_torch()
    eager = eager_baseline()
    results = []
    print(f"zoo: {len(chosen)} models, {_calls_text(args.calls)}, images {args.size}x{args.size}, batch 1, "
          f"random weights, eval, no_grad; {args.mode} mode; timeout {args.timeout:g} s", flush=True)
    print(f"eager: {eager}", flush=True)
    for i, (name, family) in enumerate(chosen, 1):
        results.append(run_isolated(name, family, args))
        print(progress_line(i, len(chosen), results[-1]), flush=True)
        if args.json:
            write_json(args.json, eager, {f: calls_for(f, args.calls) for f in FAMILIES}, results)
    print()
    print_table(results)
    print_notes(results)
    print_failures(results)
    print()
    print(summary_line(results))
    print(*geomean_lines(results), sep="\n")
    if args.png:
        write_chart(args.png, results, eager)
    return 1 if any(r["status"] in ("WRONG", "LEAKED") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
