"""The model zoo: eager PyTorch, torch.compile (Inductor) and dynamo side by side on torchvision,
timm and Hugging Face models and torch.nn blocks, correctness first.

Families (random weights, nothing downloaded; eval mode, batch 1, torch.no_grad()):
- classification, segmentation, detection, video: torchvision's models at 64x64 (larger where a
  model needs it; video clips 1x3x8x64x64). By default a chosen set per family (TORCHVISION) that
  keeps the whole zoo under 45 minutes with torch.compile's cold compiles; --all-torchvision runs
  every builder torchvision registers. Weight matrices initialized to zeros (ViT's head) get
  random values, or the output would be all zeros. Detection models keep every box (score
  threshold 0) and, but for SSD, work at the input's size instead of resizing to 800.
- nn: torch.nn's attention and recurrent blocks (TransformerEncoderLayer, a TransformerEncoder of
  2, TransformerDecoderLayer, MultiheadAttention, LSTM, Transformer), batch_first.
- timm: TIMM's models across timm's families, at 64x64 (img_size=64 where a model takes one).
- hf: Hugging Face transformers models built from small configs (HF below): encoders (BERT,
  RoBERTa, DistilBERT, ALBERT), decoders (GPT-2, LLaMA with rotary embeddings and RMSNorm),
  encoder-decoder (T5), vision (ViT) and speech (Whisper), use_cache=False, on 128 token ids.
- audio: none. PyPI's newest torchaudio (2.11.1) requires torch 2.11, so pip installs none
  beside torch 2.14.1.
The zoo calls model(x): a model taking several inputs or returning a tuple is wrapped in a
one-input Module (decoders get x as target and memory, MultiheadAttention is self-attention
without weights, LSTM returns its output only, T5 and Whisper decode the ids built in the call).

Sides (--sides): eager; compile: torch.compile(copy) with Inductor's defaults and
torch._inductor.config.freezing = True (PyTorch's CPU inference recommendation); dynamo:
dynamo.optimize(copy) (--mode hook: the call inside `with dynamo.optimize():` instead); backend:
torch.compile(copy, backend="dynamo"), PyTorch's front end (TorchDynamo's FX graphs) with dynamo's
engine behind it.
Each model runs in its own child process with cold caches (DYNAMO_CACHE_DIR=off, an empty
TORCHINDUCTOR_CACHE_DIR), THREADS threads for every side; side by side, in order:
1. first calls: each side's first call (eager's too) on the first input, timed: dynamo records
   and compiles there, torch.compile traces and compiles ("1st call");
2. checked calls: --calls inputs (fresh random values each; the first is call 1's), every output
   compared with eager's on the same input: float tensors with allclose(rtol 1e-3, atol 1e-3 *
   max|eager output|), everything else exactly; an R-CNN keeps every box (_detection_kwargs), and
   any detection model's boxes that still hang on tied scores are held to what eager itself does
   under rounding-sized noise (_rounding_budget);
3. timing, each side alone, after all sides passed 1 and 2: two rounds, the sides in turn (the
   order reversed in the second, so that no side always runs first), each block a pause, 2
   warm-up calls, then 4 samples, each the mean of back-to-back calls (as many as fill SAMPLE_S at
   eager's speed, at most MAX_REPEAT). best = the fastest of a side's 8 samples, median = their
   median.
Steps 1 and 2 run eager, then dynamo, the backend and torch.compile, and the child prints the
result after each, so that an Inductor compile over the timeout costs only its own column.

Per model: dynamo's status, largest error, native runs and traces (dynamo.counters() deltas), the
first fallback reason (dynamo.report()), each side's best and median ms, "vs eager" (eager best /
dynamo best) and "vs compile" (torch.compile best / dynamo best; > 1 where dynamo is faster), both
first calls, torch.compile's own status. At the end: geomeans of both ratios over the models that
ran ok with a native run, overall and per family, first-call geomean (Inductor's over ours), and
the models slower than torch.compile. --png draws both ratios as bars.

Status (dynamo's, and the backend's: both are our engine): ok; WRONG (an output differs from
eager's); LEAKED (dynamo or the backend raised, or the process died in their call, where eager
did not); eager-fails (building the model or an eager
call raised: nothing to compare); skipped (over --timeout before dynamo's result). torch.compile's
column: ok; differs (its output is not eager's within the tolerance: its times are shown, its
ratio is not counted); fails (it raised); over time; off (not in --sides). The exit status is 1 when
any model is WRONG or LEAKED. --json writes {"eager", "calls", "results", "geomean"}.

    PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/models.py \
        [--models resnet18,hf.bert] [--family classification,timm,hf] [--all-torchvision] \
        [--sides eager,compile,dynamo] [--calls 4] [--size 64] [--timeout 900] [--mode module|hook] \
        [--json results.json] [--png zoo.png]
(`--run-one NAME --family F` runs one model's child by hand, to debug it.)
"""
import argparse
import copy
import functools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import namedtuple
from collections.abc import Mapping

FAMILIES = ("classification", "segmentation", "detection", "video", "nn", "timm", "hf")
SIDES = ("eager", "compile", "dynamo", "backend")  # eager always runs: the others are compared with it
THREADS = 2  # torch's threads in every process of the zoo, every side alike
DEFAULT_CALLS = 4
RESULT_TAG = "@result "
PHASE_TAG = "@phase "

# ---------------------------------------------------------------------------------------------
# Which models, built how, with which input

# The default torchvision set: each architecture family once (its smallest common member), so that
# torch.compile's cold compiles (20 s to minutes each on two cores) keep the zoo under 45 minutes.
TORCHVISION = {
    "classification": ("alexnet", "vgg11", "resnet18", "resnet50", "resnext50_32x4d", "densenet121",
                       "squeezenet1_1", "googlenet", "inception_v3", "mobilenet_v2", "mobilenet_v3_large",
                       "shufflenet_v2_x1_0", "mnasnet1_0", "efficientnet_b0", "regnet_y_400mf", "convnext_tiny",
                       "vit_b_16", "swin_t"),
    "segmentation": ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"),
    "detection": ("fasterrcnn_mobilenet_v3_large_320_fpn", "ssdlite320_mobilenet_v3_large"),
    "video": ("r3d_18", "r2plus1d_18"),
}
VIDEO_CLIP = (1, 3, 8, 64, 64)

# timm: name -> keyword arguments of timm.create_model (img_size where the model is sized by it)
TIMM = {name: {} for name in (
    "resnet26d", "resnext26ts", "cspresnet50", "dla34", "hrnet_w18_small", "repvgg_a0", "efficientnet_b0",
    "mobilenetv3_large_100", "mobilenetv4_conv_small", "ghostnet_100", "rexnet_100", "regnety_002",
    "convnext_atto", "edgenext_xx_small", "fastvit_t8", "mobilevit_xxs", "poolformer_s12", "pvt_v2_b0")}
TIMM.update({name: {"img_size": 64} for name in (
    "vit_tiny_patch16_224", "deit_tiny_patch16_224", "levit_128s", "mixer_s16_224", "resmlp_12_224",
    "coatnet_0_rw_224")})
TIMM["eva02_tiny_patch14_224"] = {"img_size": 56}  # (rotary embeddings; 56 divides by its patch 14)
TIMM_SIDE = {"eva02_tiny_patch14_224": 56}


def _hf_models():
    """name -> (builder, input kind, input shape) for the hf family: small configs, random weights.
    Input kinds: ids (token ids below 1000), image, features (Whisper's log-mel frames)."""
    import transformers as T
    wrap = _hf_wrappers()
    enc = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
    ids = (1, 128)

    def model(config_cls, model_cls, wrapper=wrap["Output"], **kw):
        return lambda: wrapper(model_cls(config_cls(**kw)))
    return {
        "hf.bert": (model(T.BertConfig, T.BertModel, **enc), "ids", ids),
        "hf.roberta": (model(T.RobertaConfig, T.RobertaModel, **enc), "ids", ids),
        "hf.distilbert": (model(T.DistilBertConfig, T.DistilBertModel, dim=128, n_layers=2, n_heads=4,
                                hidden_dim=256), "ids", ids),
        "hf.albert": (model(T.AlbertConfig, T.AlbertModel, embedding_size=64, **enc), "ids", ids),
        "hf.gpt2": (model(T.GPT2Config, T.GPT2Model, n_embd=128, n_layer=2, n_head=4, use_cache=False), "ids", ids),
        "hf.llama": (model(T.LlamaConfig, T.LlamaModel, num_key_value_heads=2, use_cache=False, **enc), "ids", ids),
        "hf.t5": (model(T.T5Config, T.T5Model, wrap["SelfDecode"], d_model=128, d_ff=256, d_kv=32, num_layers=2,
                        num_heads=4, use_cache=False), "ids", ids),
        "hf.vit": (model(T.ViTConfig, T.ViTModel, image_size=64, patch_size=8, **enc), "image", (1, 3, 64, 64)),
        "hf.whisper": (model(T.WhisperConfig, T.WhisperModel, wrap["Transcribe"], d_model=128, encoder_layers=2,
                             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                             encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=80, max_source_positions=50,
                             max_target_positions=64, use_cache=False), "features", (1, 80, 100)),
    }


@functools.cache
def _one_input():
    """The base of the zoo's wrappers: a Module holding the wrapped model or block as .block."""
    import torch

    class OneInput(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block
    return OneInput


def _hf_wrappers():
    """One-input Modules around a transformers model: Output (model(x), its ModelOutput as is),
    SelfDecode (encoder-decoder: the ids are both encoder and decoder input), Transcribe
    (Whisper: 16 decoder ids built in the call)."""
    import torch
    OneInput = _one_input()

    class Output(OneInput):
        def forward(self, x):
            return self.block(x)

    class SelfDecode(OneInput):
        def forward(self, x):
            return self.block(input_ids=x, decoder_input_ids=x)

    class Transcribe(OneInput):
        def forward(self, x):
            return self.block(input_features=x, decoder_input_ids=torch.arange(16).unsqueeze(0))

    return {"Output": Output, "SelfDecode": SelfDecode, "Transcribe": Transcribe}


def _wrappers():
    """One-input Modules around torch.nn blocks that take several inputs or return a tuple:
    SelfAttention, SelfDecode, OutputOnly."""
    OneInput = _one_input()

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

    return SelfAttention, SelfDecode, OutputOnly


def _nn_blocks():
    """name -> (builder, input shape) for the nn family: torch.nn's attention and recurrent blocks."""
    import torch.nn as nn
    attend, decode, first = _wrappers()
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


def _family_module(family):
    """The torchvision module whose registered builders form a family."""
    import torchvision.models as tvm
    return {"classification": tvm, "segmentation": tvm.segmentation, "detection": tvm.detection,
            "video": tvm.video}[family]


def family_names(family, all_torchvision=False):
    """The names of a family's models, in the zoo's order."""
    if family == "nn":
        return list(_nn_blocks())
    if family == "timm":
        return ["timm." + n for n in TIMM]
    if family == "hf":
        return list(_hf_models())
    if all_torchvision:
        from torchvision.models import list_models as registered
        return registered(module=_family_module(family))
    return list(TORCHVISION[family])


def list_models(families=FAMILIES, all_torchvision=False):
    """(name, family) for every model of the families."""
    return [(name, fam) for fam in families for name in family_names(fam, all_torchvision)]


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
    to 800). An R-CNN keeps every box: every proposal (no top-n cut, NMS at IoU 1.0 removes
    nothing) and every class of every proposal (box NMS at 1.0, no cap). With random weights at
    64x64 many proposals pool the same features and their scores tie to the last bit, so which
    boxes a top-n cut or NMS keeps is decided by rounding (another summation order picks others,
    and NMS cascades that into more boxes: 5-20 of 100 moved against eager, for Inductor as for
    us); with nothing dropped the output is a continuous function of the input again, compared
    like any other (ties in the order are matched by _tied_order). The whole model still runs,
    with ~12,000 detections to post-process instead of 100."""
    if name.startswith("ssd"):
        return {"score_thresh": 0.0}
    if "rcnn" in name:
        return {"box_score_thresh": 0.0, "min_size": size, "max_size": size,
                "rpn_pre_nms_top_n_test": 1000, "rpn_post_nms_top_n_test": 1000, "rpn_nms_thresh": 1.0,
                "box_nms_thresh": 1.0, "box_detections_per_img": 100000}
    return {"score_thresh": 0.0, "min_size": size, "max_size": size}


def builder_kwargs(name, family, size):
    """Keyword arguments for a torchvision builder: random weights, nothing downloaded, sized for
    `size`."""
    kw = {"weights": None}
    if family in ("segmentation", "detection"):
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


Input = namedtuple("Input", "kind shape note")  # kind: image, detection, ids, features


def model_input(name, family, size):
    """The model's input: a batch of one image of the side it takes (the smallest >= size), a
    list of one image (detection), a video clip, or an nn/hf model's own input."""
    if family == "nn":
        return Input("image", _nn_blocks()[name][1], "")
    if family == "hf":
        _, kind, shape = _hf_models()[name]
        return Input(kind, shape, "")
    if family == "video":
        return Input("image", VIDEO_CLIP, "")
    if family == "timm":
        side = TIMM_SIDE.get(name[len("timm."):], size)
        return Input("image", (1, 3, side, side), f"{side}x{side}" if side != size else "")
    side, note = model_size(name, size)
    return Input("detection" if family == "detection" else "image", (1, 3, side, side),
                 note or family_note(name, family))


def build_model(name, family, size):
    """The model in eval mode, with seeded random weights (none left all zero), built under
    no_grad: a weight derived at build time (weight_norm) is then no autograd result, which
    copy.deepcopy refuses."""
    import torch
    torch.manual_seed(0)
    with torch.no_grad():
        if family == "nn":
            model = _nn_blocks()[name][0]()
        elif family == "hf":
            model = _hf_models()[name][0]()
        elif family == "timm":
            import timm
            model = timm.create_model(name[len("timm."):], pretrained=False, **TIMM[name[len("timm."):]])
        else:
            from torchvision.models import get_model_builder
            side = model_input(name, family, size).shape[-1]
            model = get_model_builder(name)(**builder_kwargs(name, family, side))
            if family == "detection":
                _spread_scores(model, side)
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


def make_input(kind, shape, seed):
    """One call's input, the same for a seed: a list of one image in [0, 1] (detection), token ids
    below 1000 (ids), else a standard normal tensor of the shape (images, clips, sequences,
    features)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    if kind == "detection":
        return [torch.rand(*shape[1:], generator=gen)]
    if kind == "ids":
        return torch.randint(0, 1000, shape, generator=gen)
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


def side_callable(side, model, mode="module"):
    """What a side calls: the model (eager), dynamo's optimized copy, or torch.compile's with
    Inductor's weight freezing on."""
    if side == "dynamo":
        import dynamo
        return dynamo.optimize(model) if mode == "module" else _under_hook(model)
    if side == "compile":
        import torch
        import torch._inductor.config as inductor
        inductor.freezing = True
        return torch.compile(model)
    if side == "backend":
        import torch
        return torch.compile(model, backend="dynamo")
    return model


def _timed(fn, x):
    """(result, seconds) of fn(x)."""
    t0 = time.perf_counter()
    out = fn(x)
    return out, time.perf_counter() - t0


# A call shorter than SAMPLE_S is timed as the mean of back-to-back calls (as timeit's autorange):
# one sub-millisecond call is mostly timer and scheduler noise. The calls per sample come from
# eager's second call and are the same on every side.
SAMPLE_S = 0.02
MAX_REPEAT = 50
WARM_CALLS = 2
ALONE_SAMPLES = 8  # per side, over TIMING_ROUNDS blocks
TIMING_ROUNDS = 2


def repeats_for(seconds):
    """Calls per timed sample for a model whose call takes `seconds`."""
    if not seconds or seconds >= SAMPLE_S:
        return 1
    return max(1, min(MAX_REPEAT, int(SAMPLE_S / seconds)))


def _sampled(fn, x, repeat):
    """Mean seconds per call over `repeat` calls, each on its own clone of x (cloned outside the
    timed part)."""
    total = 0.0
    for _ in range(repeat):
        total += _timed(fn, clone_input(x))[1]
    return total / repeat


OURS = ("dynamo", "backend")  # the sides whose answers are ours: a difference is WRONG


def _side_result():
    return dict(status="ok", reason="", traceback="", first_s=None, calls=0, max_err=0.0, samples=[],
                best=None, median=None)


class ModelRun:
    """Eager, dynamo and torch.compile side by side on one model; fills a result dict as it goes
    and hands it to `emit` after each compiled side."""

    def __init__(self, name, family, size, calls, sides=SIDES, mode="module"):
        self.inp = model_input(name, family, size)
        self.family, self.size, self.mode = family, size, mode
        self.sides = [s for s in ("dynamo", "backend", "compile") if s in sides]
        self.inputs = [make_input(self.inp.kind, self.inp.shape, seed=1000 + k) for k in range(max(1, calls))]
        self.want = []  # eager's output per input
        self.budgets = {}  # input index -> _rounding_budget (detection)
        self.repeat = 1
        self.r = dict(name=name, family=family, shape=list(self.inp.shape), note=self.inp.note, status="ok",
                      reason="", traceback="", max_err=0.0, max_abs=0.0, calls_done=0, counters={},
                      backend_counters={}, fallback="", dynamo_calls=0, repeat=1, sides={"eager": _side_result()})

    def _fail(self, status, reason, tb=""):
        self.r.update(status=status, reason=reason, traceback=tb)

    def _note(self, text):
        self.r["note"] = (self.r["note"] + "; " if self.r["note"] else "") + text

    def _eager_calls(self, model):
        """Eager's output on every input (call 1 timed as its first call); False when eager raised."""
        s = self.r["sides"]["eager"]
        for k, x in enumerate(self.inputs):
            _phase(f"eager call {k + 1}")
            try:
                out, t = _timed(model, clone_input(x))
            except Exception as e:  # noqa: BLE001 -- whatever the model raises is the finding
                reason = f"eager call {k + 1}: {type(e).__name__}: {e}"
                self._fail("eager-fails", reason, traceback.format_exc())
                s.update(status="fails", reason=reason)
                return False
            self.want.append(out)
            s["calls"] = k + 1
            if k == 0:
                s["first_s"] = t
            if k == min(1, len(self.inputs) - 1):
                self.repeat = self.r["repeat"] = repeats_for(t)
        return True

    def _check(self, k, got, eager):
        """(max abs error, max |want|) of call k's output against eager's; raises Mismatch. A
        detection model's boxes that differ are held to what eager's own output does under
        rounding-sized noise (_rounding_budget): no more of them elsewhere than that."""
        try:
            return compare(self.want[k], got)
        except Mismatch as m:
            moved = _unmatched(got, self.want[k]) if self.family == "detection" else None
            if moved is None:
                raise
            if k not in self.budgets:
                self.budgets[k] = _rounding_budget(eager, self.inputs[k], self.want[k])
            if not 0 < moved <= self.budgets[k]:
                raise
            if "rounding-sized noise" not in self.r["note"]:
                self._note(f"call {k + 1}: {moved} of the boxes differ ({m.args[0]}), where eager given "
                           f"rounding-sized noise moves up to {self.budgets[k]} (tied scores)")
            return 0.0, 0.0

    def _checked_calls(self, side, fn, eager):
        """The side's call on every input, each compared with eager's output; False when it raised."""
        s = self.r["sides"][side]
        for k, x in enumerate(self.inputs):
            _phase(f"{side} call {k + 1}" + (" (recording and compiling)" if k == 0 else ""))
            try:
                out, t = _timed(fn, clone_input(x))
            except Exception as e:  # noqa: BLE001 -- whatever the side raises is the finding
                reason = f"{side} call {k + 1}: {type(e).__name__}: {e}"
                s.update(status="fails", reason=reason, traceback=traceback.format_exc())
                if side in OURS:
                    self._fail("LEAKED", reason, s["traceback"])
                return False
            if side == "dynamo":
                self.r["dynamo_calls"] += 1
                self.r["calls_done"] = k + 1
            s["calls"] = k + 1
            if k == 0:
                s["first_s"] = t
            try:
                err, scale = self._check(k, out, eager)
            except Mismatch as m:
                err, scale = (m.args[1], m.args[2]) if len(m.args) == 3 else (math.inf, 0.0)
                if s["status"] == "ok":
                    s.update(status="differs", reason=f"call {k + 1}: {m.args[0]}")
                if side in OURS and self.r["status"] == "ok":
                    self._fail("WRONG", f"{side} call {k + 1}: {m.args[0]}")
            s["max_err"] = max(s["max_err"], err)
            if side == "dynamo":
                self.r["max_err"], self.r["max_abs"] = max(self.r["max_err"], err), max(self.r["max_abs"], scale)
        return True

    def _count(self, side, before):
        """Adds the dynamo counters' change since `before` to the side's (dynamo or backend)."""
        import dynamo
        after = dynamo.counters()
        key = "counters" if side == "dynamo" else "backend_counters"
        mine = self.r[key] or {k: 0 for k in after}
        self.r[key] = {k: mine.get(k, 0) + after[k] - before[k] for k in after}

    def _timing(self, live):
        """Every side that passed its checked calls, timed alone: TIMING_ROUNDS rounds, the sides
        in turn (the order reversed every other round, so that no side always comes first), each
        block a pause, WARM_CALLS calls, then ALONE_SAMPLES / TIMING_ROUNDS samples of `repeat`
        calls with no other side in between."""
        import dynamo
        x = make_input(self.inp.kind, self.inp.shape, seed=2000)
        order = list(live)
        for rnd in range(TIMING_ROUNDS):
            for side in (order if rnd % 2 == 0 else order[::-1]):
                fn, s = live.get(side), self.r["sides"][side]
                if fn is None:
                    continue
                _phase(f"timing {side} alone (round {rnd + 1})")
                time.sleep(0.2)
                before = dynamo.counters()
                try:
                    for _ in range(WARM_CALLS):
                        fn(clone_input(x))
                    s["samples"] += [_sampled(fn, x, self.repeat) for _ in range(ALONE_SAMPLES // TIMING_ROUNDS)]
                except Exception as e:  # noqa: BLE001 -- the checked calls passed: report it as the side's
                    s.update(status="fails", reason=f"{side} timed call: {type(e).__name__}: {e}",
                             traceback=traceback.format_exc(), samples=[])
                    del live[side]
                    if side in OURS:
                        self._fail("LEAKED", s["reason"], s["traceback"])
                if side in OURS:
                    self._count(side, before)
                if side == "dynamo":
                    self.r["dynamo_calls"] += WARM_CALLS + ALONE_SAMPLES // TIMING_ROUNDS * self.repeat
        for side in live:
            s = self.r["sides"][side]
            if s["samples"]:
                s.update(best=min(s["samples"]), median=statistics.median(s["samples"]))

    def run(self, emit):
        """Builds, runs eager, then each compiled side (its first call, the checked calls),
        emitting the result after each; then times every side that passed (_timing) and emits the
        result again; returns it."""
        import dynamo
        import torch
        dynamo.reset()
        _phase("building the model")
        try:
            eager = build_model(self.r["name"], self.family, self.size)
            copies = {side: copy.deepcopy(eager) for side in self.sides}
        except Exception as e:  # noqa: BLE001 -- any builder failure is the model's, not ours
            self._fail("eager-fails", f"build: {type(e).__name__}: {e}", traceback.format_exc())
            emit(self.r)
            return self.r
        with torch.no_grad():
            if not self._eager_calls(eager):
                emit(self.r)
                return self.r
            live = {"eager": eager}
            for side in self.sides:
                self.r["sides"][side] = _side_result()
                before = dynamo.counters()
                fn = side_callable(side, copies.pop(side), self.mode)
                if self._checked_calls(side, fn, eager) and self.r["sides"][side]["status"] != "fails":
                    live[side] = fn
                if side in OURS:
                    self._count(side, before)
                if side == "dynamo":
                    self.r["fallback"] = first_fallback(dynamo.report())
                emit(self.r)
            self._timing(live)
        emit(self.r)
        return self.r


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
    noise of 1e-6 (far above a compiled model's rounding, 1e-13..1e-8 here), over 16 such runs
    (6 measured too few: fasterrcnn_mobilenet_v3_large_320_fpn's scores tie to 1 ulp in runs of
    ten, and a compiled call moved one box more than the six runs had);
    0 for a well-conditioned output. Random weights over a 64x64 image make many proposals pool
    the same features: their scores tie exactly or to 1e-7, which of them top-k and NMS keep is
    the last bit's (any other summation order, such as a compiled GEMM's row blocks, changes it),
    and NMS cascades a different pick into other boxes kept or suppressed."""
    import torch
    budget = 0
    for seed in range(7, 15):
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


def eager_baseline():
    """perf/baseline.py's describe() (BLAS, allocator, threads) of this process."""
    from baseline import describe
    return describe()


def run_one(name, family, size, calls, sides, mode):
    """The child's work: one model, its result printed as a tagged JSON line after each side."""
    setup_torch()
    ModelRun(name, family, size, calls, sides, mode).run(
        lambda r: print(RESULT_TAG + json.dumps(r), flush=True))


# ---------------------------------------------------------------------------------------------
# The parent: one child per model, the table


def _last_phase(stdout):
    """The last phase line a child printed, or 'starting'."""
    phases = [ln[len(PHASE_TAG):] for ln in (stdout or "").splitlines() if ln.startswith(PHASE_TAG)]
    return phases[-1] if phases else "starting"


def _empty_result(name, family, size, status, reason, tb=""):
    """A result for a model whose child gave none (timeout, crash)."""
    inp = model_input(name, family, size)
    return dict(name=name, family=family, shape=list(inp.shape), note=inp.note, status=status, reason=reason,
                traceback=tb, max_err=None, max_abs=None, calls_done=0, counters={}, fallback="", dynamo_calls=0,
                repeat=1, sides={})


def _signal_name(rc):
    """'SIGSEGV' for a child killed by signal 11, else 'exit status N'."""
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _text(v):
    return v.decode(errors="replace") if isinstance(v, bytes) else (v or "")


def _child(cmd, env, timeout):
    """(stdout, stderr, return code or None on timeout) of a child run in its own process group,
    which is killed whole on timeout (Inductor's compile workers with it)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout or None)
        return out, err, p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return _text(out), _text(err), None
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # compile workers left behind by a finished child
        except ProcessLookupError:
            pass


def run_isolated(name, family, args):
    """Runs one model in a child process under args.timeout, with cold caches; returns its result
    dict (sides the child did not finish marked as over time or crashed)."""
    cache = tempfile.mkdtemp(prefix="zoo-inductor-")
    env = dict(os.environ, DYNAMO_CACHE_DIR="off", TORCHINDUCTOR_CACHE_DIR=cache)
    cmd = [sys.executable, os.path.abspath(__file__), "--run-one", name, "--family", family,
           "--size", str(args.size), "--calls", str(args.calls), "--mode", args.mode, "--sides", args.sides]
    t0 = time.perf_counter()
    try:
        out, err, rc = _child(cmd, env, args.timeout)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    phase = _last_phase(out)
    why = f"over the {args.timeout:g} s timeout in {phase}" if rc is None else \
        f"process died ({_signal_name(rc)}) in {phase}"
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if lines:
        r = json.loads(lines[-1][len(RESULT_TAG):])
    elif rc is None:
        r = _empty_result(name, family, args.size, "skipped", why)
    else:
        r = _empty_result(name, family, args.size, "LEAKED" if "dynamo" in phase else "eager-fails", why,
                          err[-4000:])
    chosen = args.sides.split(",")
    for side in ("eager",) + SIDES:
        if side not in r["sides"]:
            r["sides"][side] = dict(_side_result(), status="off" if side not in chosen else
                                    "over time" if rc is None else "fails", reason="" if side not in chosen else why)
    if "native call path is unavailable" in err:
        r["note"] = (r["note"] + "; " if r["note"] else "") + \
            "dynamo ran without its native call path (_fastcall not built): its times are not representative"
    r["wall_s"] = time.perf_counter() - t0
    return r


def _ratio(a, b):
    return a / b if a and b else None


def ratios(r):
    """A result's ratios, None where a side has no time (> 1: ours is faster): vs_eager (eager best
    / dynamo best), vs_compile (torch.compile best / dynamo best, only where torch.compile's output
    matched eager's), first_ratio (torch.compile's first call / dynamo's), backend_vs_compile
    (torch.compile best / torch.compile(backend="dynamo") best)."""
    s = r["sides"]
    dyn, comp, back = s.get("dynamo", {}), s.get("compile", {}), s.get("backend", {})
    ok = r["status"] == "ok"
    comp_ok = ok and comp.get("status") == "ok"
    return dict(vs_eager=_ratio(s["eager"].get("best"), dyn.get("best")) if ok else None,
                vs_compile=_ratio(comp.get("best"), dyn.get("best")) if comp_ok else None,
                first_ratio=_ratio(comp.get("first_s"), dyn.get("first_s")) if ok and comp.get("first_s") else None,
                backend_vs_compile=_ratio(comp.get("best"), back.get("best")) if comp_ok else None)


def _fmt(v, spec=".2g"):
    return "-" if v is None else format(v, spec)


def _ms(seconds):
    """Milliseconds, 3 figures or so: '0.42', '12.3', '145'."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _s(seconds):
    return "-" if seconds is None else f"{seconds:.1f}"


def _x(ratio):
    return "-" if ratio is None else f"{ratio:.2f}x"


def _native(r):
    """Native runs / calls of the optimized model (a model compiled in parts has a run per part
    that ran natively)."""
    c = r.get("counters") or {}
    return f"{c.get('native_runs', 0)}/{r.get('dynamo_calls') or r['calls_done']}" if c else "-"


def _backend_native(r):
    """Native runs of torch.compile(backend="dynamo"): one per FX graph call that ran natively."""
    c = r.get("backend_counters") or {}
    return str(c.get("native_runs", 0)) if c else "-"


def _why(r):
    """The table's reason column: a failure's reason, else the first fallback (or guard misses)."""
    if r["status"] != "ok":
        return r["reason"]
    if r.get("fallback"):
        return "fallback: " + r["fallback"]
    misses = (r.get("counters") or {}).get("guard_misses", 0)
    return f"{misses} guard miss(es)" if misses else ""


def _compile_status(r):
    s = r["sides"].get("compile", {})
    return s.get("status", "off") + (f": {s['reason']}" if s.get("reason") and s.get("status") != "ok" else "")


COLUMNS = ("model", "input", "status", "max err", "native", "traces", "eager ms", "compile ms", "dynamo ms",
           "vs eager", "vs compile", "backend ms", "backend native", "dynamo 1st ms", "compile 1st s", "torch.compile",
           "reason / first fallback")


def _cut(text, width):
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[:width - 3] + "..."


def table_row(r, width=90):
    """One row of the results table (reasons cut to width)."""
    c = r.get("counters") or {}
    s = r["sides"]
    q = ratios(r)
    traces = f"{c.get('traces_compiled', 0)}+{c.get('side_traces_compiled', 0)}" if c else "-"
    return (r["name"], "x".join(map(str, r["shape"])), r["status"], _fmt(r.get("max_err")), _native(r), traces,
            _ms(s["eager"].get("best")), _ms(s["compile"].get("best")), _ms(s["dynamo"].get("best")),
            _x(q["vs_eager"]), _x(q["vs_compile"]), _ms(s["backend"].get("best")), _backend_native(r),
            _ms(s["dynamo"].get("first_s")), _s(s["compile"].get("first_s")), _cut(_compile_status(r), 40),
            _cut(_why(r), width))


def print_table(results, out=sys.stdout):
    """The results table, columns padded to their widest cell."""
    rows = [COLUMNS] + [table_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)


def progress_line(i, n, r):
    """The line printed as a model finishes."""
    name, _, status, err, native, _, eager, comp, jit, vs_e, vs_c, back, _, first, cfirst, cstat, why = \
        table_row(r, 100)
    return (f"[{i:>3}/{n}] {name:<38} {status:<11} err {err:<8} native {native:<6} eager {eager:>6} ms  "
            f"compile {comp:>6} ms  dynamo {jit:>6} ms  vs eager {vs_e:>6}  vs compile {vs_c:>6}  "
            f"backend {back:>6} ms  1st {first:>6} ms / {cfirst:>5} s  {r['wall_s']:5.0f} s  "
            f"{'' if cstat == 'ok' else '[torch.compile ' + cstat + '] '}{why}")


def summary_line(results):
    """zoo: N models, ok X, WRONG Y, LEAKED Z, native in W (W: models with a native run)."""
    count = lambda s: sum(r["status"] == s for r in results)  # noqa: E731
    native = sum((r.get("counters") or {}).get("native_runs", 0) > 0 for r in results)
    extra = "".join(f", {s} {count(s)}" for s in ("eager-fails", "skipped") if count(s))
    text = f"zoo: {len(results)} models, ok {count('ok')}, WRONG {count('WRONG')}, LEAKED {count('LEAKED')}, " \
           f"native in {native}{extra}"
    for side, what in (("backend", "torch.compile(backend=\"dynamo\")"), ("compile", "torch.compile")):
        seen = [r["sides"].get(side, {}).get("status") for r in results]
        counts = ", ".join(f"{s} {seen.count(s)}" for s in ("ok", "differs", "fails", "over time") if seen.count(s))
        if counts:
            text += f"; {what}: {counts}"
    return text


def _timed_natively(results):
    """The models the geomeans cover: ok, with a native run and a time on both sides."""
    return [r for r in results if r["status"] == "ok" and ratios(r)["vs_eager"] is not None
            and (r.get("counters") or {}).get("native_runs", 0) > 0]


def _geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def geomeans(results):
    """{'all' and each family: {ratio key: (geomean or None, models)}} over the models timed
    natively."""
    timed = _timed_natively(results)
    out = {}
    for g in ("all",) + FAMILIES:
        rows = [ratios(r) for r in timed if g in ("all", r["family"])]
        if rows or g == "all":
            out[g] = {k: (_geomean([q[k] for q in rows]), sum(q[k] is not None for q in rows))
                      for k in ("vs_eager", "vs_compile", "first_ratio", "backend_vs_compile")}
    return out


def geomean_lines(results):
    """The geomeans (overall and per family) and the models slower than eager / torch.compile."""
    lines = ["geomeans over the models ok with a native run (models): dynamo vs eager, dynamo vs torch.compile, "
             "first call (torch.compile's / dynamo's), torch.compile(backend=\"dynamo\") vs torch.compile"]
    for g, m in geomeans(results).items():
        lines.append(f"  {g:<15} vs eager {_x(m['vs_eager'][0]):>6} ({m['vs_eager'][1]:>2})   "
                     f"vs compile {_x(m['vs_compile'][0]):>6} ({m['vs_compile'][1]:>2})   "
                     f"first call {_x(m['first_ratio'][0]):>7} ({m['first_ratio'][1]:>2})   "
                     f"backend vs compile {_x(m['backend_vs_compile'][0]):>6} ({m['backend_vs_compile'][1]:>2})")
    timed = _timed_natively(results)
    for key, what in (("vs_eager", "eager"), ("vs_compile", "torch.compile")):
        slower = sorted((r for r in timed if ratios(r)[key] is not None and ratios(r)[key] < 1.0),
                        key=lambda r: ratios(r)[key])
        names = ", ".join(f"{r['name']} {_x(ratios(r)[key])}" for r in slower)
        lines.append(f"slower than {what}: {len(slower)} of {sum(ratios(r)[key] is not None for r in timed)}"
                     + (f": {names}" if slower else ""))
    return lines


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


FAMILY_COLOURS = dict(zip(FAMILIES, ("tab:blue", "tab:cyan", "tab:red", "tab:olive", "tab:orange", "tab:green",
                                     "tab:purple")))


def _draw(ax, rows, key, label):
    """One horizontal bar per result, from 1.0 to its ratio on a log axis, coloured by family."""
    values = [ratios(r)[key] or 1.0 for r in rows]
    lo, hi = min(values + [1.0]) / 1.2, max(values + [1.0]) * 1.2
    ticks = [2.0 ** k for k in range(-6, 7) if lo <= 2.0 ** k <= hi]
    ax.barh(range(len(rows)), [v - 1.0 for v in values], left=1.0,
            color=[FAMILY_COLOURS[r["family"]] for r in rows])
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(label, fontsize=8)


def write_chart(path, results, eager):
    """dynamo vs eager and vs torch.compile per model timed natively, as two bar charts sharing
    the model axis (sorted by the ratio to torch.compile); the title has the date, the baseline and
    the geomeans."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print("zoo: no chart: matplotlib is missing (make deps installs it)")
        return
    rows = sorted(_timed_natively(results), key=lambda r: (ratios(r)["vs_compile"] or 0, ratios(r)["vs_eager"]))
    if not rows:
        print("zoo: no chart: no model ran ok with a native run")
        return
    geo = geomeans(results)["all"]
    fig, (left, right) = plt.subplots(1, 2, sharey=True, figsize=(12, 1.8 + 0.16 * len(rows)))
    _draw(left, rows, "vs_eager", "eager best / dynamo best (> 1: dynamo is faster)")
    _draw(right, rows, "vs_compile", "torch.compile best / dynamo best (> 1: dynamo is faster)")
    left.set_yticks(range(len(rows)))
    left.set_yticklabels([r["name"] for r in rows], fontsize=7)
    left.set_ylim(-0.7, len(rows) - 0.3)
    present = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    right.legend(handles=[Patch(color=FAMILY_COLOURS[f], label=f) for f in present], loc="lower right", fontsize=8)
    fig.suptitle(f"dynamo model zoo, {time.strftime('%Y-%m-%d')}: geomean {_x(geo['vs_eager'][0])} vs eager "
                 f"({geo['vs_eager'][1]} models), {_x(geo['vs_compile'][0])} vs torch.compile "
                 f"({geo['vs_compile'][1]})\n{eager}", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"zoo: chart in {path}")


def write_json(path, eager, calls, results):
    """Every result (full reasons, tracebacks, samples), the baseline, the calls and the geomeans."""
    for r in results:
        r.update(ratios(r))
    geo = {g: {k: dict(geomean=v, models=n) for k, (v, n) in m.items()} for g, m in geomeans(results).items()}
    with open(path, "w") as f:
        json.dump(dict(eager=eager, calls=calls, results=results, geomean=geo), f, indent=1)


def select(args):
    """The (name, family) pairs to run, in the zoo's order, filtered by --models / --family."""
    families = [f for f in args.family.split(",") if f]
    for f in families:
        if f == "audio":
            sys.exit("models.py: no audio family: pip has no torchaudio for torch 2.14.1 (see --help)")
        if f not in FAMILIES:
            sys.exit(f"models.py: unknown family {f!r} (have {', '.join(FAMILIES)})")
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown or "eager" not in sides:
        sys.exit(f"models.py: --sides takes eager (always) and any of compile, dynamo; got {args.sides!r}")
    chosen = list_models(families, args.all_torchvision)
    if args.models:
        wanted = [m for m in args.models.split(",") if m]
        known = dict(list_models(FAMILIES, True))
        missing = [m for m in wanted if m not in known]
        if missing:
            sys.exit(f"models.py: unknown model(s) {', '.join(missing)}")
        chosen = [(m, known[m]) for m in wanted]
    return chosen


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated model names (default: all of --family)")
    p.add_argument("--family", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES))
    p.add_argument("--all-torchvision", action="store_true",
                   help="every model torchvision registers (default: TORCHVISION's set)")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated: eager and any of compile, dynamo")
    p.add_argument("--calls", type=int, default=DEFAULT_CALLS,
                   help=f"checked calls per model, each with a fresh input (default {DEFAULT_CALLS})")
    p.add_argument("--size", type=int, default=64, help="image side (default 64; larger where a model needs it)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per model (default 600; 0: none)")
    p.add_argument("--mode", choices=("module", "hook"), default="module",
                   help="module: dynamo.optimize(model) (default); hook: the call runs inside "
                        "`with dynamo.optimize():`, so submodules compile where the forward cannot")
    p.add_argument("--json", default="", help="also write every result (full reasons, tracebacks) here")
    p.add_argument("--png", default="", help="also draw the ratios here (default: no chart)")
    p.add_argument("--run-one", default="", help=argparse.SUPPRESS)  # the child process
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.run_one:
        run_one(args.run_one, args.family, args.size, args.calls, args.sides.split(","), args.mode)
        return 0
    chosen = select(args)
    setup_torch()
    eager = eager_baseline()
    results = []
    print(f"zoo: {len(chosen)} models, {args.calls} checked calls each, images {args.size}x{args.size}, batch 1, "
          f"random weights, eval, no_grad; sides {args.sides}; {args.mode} mode; timeout {args.timeout:g} s; "
          f"cold caches", flush=True)
    print(f"eager: {eager}", flush=True)
    t0 = time.perf_counter()
    for i, (name, family) in enumerate(chosen, 1):
        results.append(run_isolated(name, family, args))
        print(progress_line(i, len(chosen), results[-1]), flush=True)
        if args.json:
            write_json(args.json, eager, args.calls, results)
    print()
    print_table(results)
    print_notes(results)
    print_failures(results)
    print()
    print(summary_line(results) + f"; {(time.perf_counter() - t0) / 60:.0f} minutes")
    print(*geomean_lines(results), sep="\n")
    if args.png:
        write_chart(args.png, results, eager)
    return 1 if any(r["status"] in ("WRONG", "LEAKED") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
