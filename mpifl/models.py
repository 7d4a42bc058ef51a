"""Models by name, shapes inferred from the data.

==============  ==========================================================================
``mlp``         Flatten + ``model.hidden`` ReLU layers + linear classifier (FedeRiCo's
                Office-Home MLP is ``hidden=[1000, 200]`` on ``features``); with
                ``model.batchnorm=true`` a BatchNorm1d before each hidden ReLU (FedBN's
                setting; such an MLP trains batched through vmap, not the stacked path)
``lenet``       FedC2I's LeNet (Table 7): conv5(64) ReLU pool2, conv5(64) ReLU pool2,
                fc 384, fc 192, fc C. The paper's first fc takes 64*13*13, i.e. 64x64
                inputs (Office-10); the width follows the input here
``cnn_dpfl``    DPFL's CNN (appendix F.3.2/F.4.2; the text says "three conv and two fc"
                but describes two conv and three fc, which we follow): conv5(6) ReLU
                pool2, conv5(16) ReLU pool2, fc 120, fc 84, fc C on 3-channel inputs
                (400 inputs on 32x32: 62,006 parameters for 10 classes); on 1-channel
                inputs the FEMNIST variant conv5(4), conv5(12), fc 120, fc 100, fc C
                (192 inputs on 28x28: 37,586 parameters)
``cnn2``        FedeRiCo's CNN2 (from Shen et al. 2020): three 3x3 convs of 128
                channels (padding 1) each with ReLU and 2x2 max-pool, one fc
``resnet18``    torchvision's ResNet-18, ``weights=None``, its first conv made to take
                the data's channels; BatchNorm running statistics live per client
                (``Clients.buffers``) and such models train with the sequential path
==============  ==========================================================================

``model.weights``: a ``state_dict`` saved with ``torch.save`` on a local path;
every tensor whose name and shape match the model is loaded (an ImageNet
ResNet-18's 1000-way ``fc`` is thus skipped), nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from mpifl.errors import ConfigError
from mpifl.schema import ModelConfig


def _dense(width: int, widths: list[int], n_classes: int, batchnorm: bool = False) -> list[nn.Module]:
    """ReLU fc layers of ``widths`` after ``width`` inputs, then the linear classifier
    (made in this order: the order of their initial weights' draws). With
    ``batchnorm`` a BatchNorm1d sits between each hidden fc and its ReLU, where
    FedBN's paper places it (its draws are none: ones and zeros)."""
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Linear(width, w), *([nn.BatchNorm1d(w)] if batchnorm else []), nn.ReLU()]
        width = w
    return [*layers, nn.Linear(width, n_classes)]


def mlp(in_shape: tuple[int, ...], n_classes: int, hidden: list[int], batchnorm: bool = False) -> nn.Module:
    return nn.Sequential(nn.Flatten(), *_dense(math.prod(in_shape), hidden, n_classes, batchnorm))


def _pooled(n: int, k: int, s: int, p: int, d: int, ceil: bool = False) -> int:
    """Output length of a convolution or pooling window over ``n`` entries (torch's rule)."""
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:  # the last window must start inside the input or left padding
        out -= 1
    return out


def _flat_size(features: nn.Sequential, in_shape: tuple[int, ...]) -> int:
    """Entries of the features' output for one input, from the layers' shape rules
    (Conv2d, MaxPool2d and shape-keeping layers; any other layer by a forward). No
    forward: under ``torch.device("meta")`` (:func:`sizes`) one loads torch's meta
    kernels, 0.9 s of every CNN run's start (bench/README.md, Performance III)."""
    c, h, w = in_shape
    for m in features:
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d)) and not isinstance(m.padding, str):
            k, st, pad, dil = (nn.modules.utils._pair(v) for v in (m.kernel_size, m.stride, m.padding, m.dilation))
            ceil = isinstance(m, nn.MaxPool2d) and m.ceil_mode
            h, w = (_pooled(n, *a, ceil) for n, *a in zip((h, w), k, st, pad, dil))
            c = m.out_channels if isinstance(m, nn.Conv2d) else c
        elif not isinstance(m, (nn.ReLU, nn.Flatten, nn.BatchNorm2d)):
            with torch.no_grad():
                return int(features(torch.zeros(1, *in_shape)).numel())
        if h <= 0 or w <= 0:  # torch's own forward refuses it too
            raise RuntimeError(f"{m}: output size {h}x{w} is too small")
    return c * h * w


def _conv_fc(in_shape: tuple[int, ...], n_classes: int, convs: list[nn.Module], widths: list[int]) -> nn.Module:
    """conv feature extractor + ReLU fc layers of ``widths`` + linear classifier."""
    features = nn.Sequential(*convs, nn.Flatten())
    return nn.Sequential(*features, *_dense(_flat_size(features, in_shape), widths, n_classes))


def lenet(in_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    c = in_shape[0]
    convs = [nn.Conv2d(c, 64, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
             nn.Conv2d(64, 64, 5), nn.ReLU(), nn.MaxPool2d(2, 2)]
    return _conv_fc(in_shape, n_classes, convs, [384, 192])


def cnn_dpfl(in_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    c = in_shape[0]
    c1, c2, f2 = (4, 12, 100) if c == 1 else (6, 16, 84)
    convs = [nn.Conv2d(c, c1, 5), nn.ReLU(), nn.MaxPool2d(2),
             nn.Conv2d(c1, c2, 5), nn.ReLU(), nn.MaxPool2d(2)]
    return _conv_fc(in_shape, n_classes, convs, [120, f2])


def cnn2(in_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    convs: list[nn.Module] = []
    c = in_shape[0]
    for _ in range(3):
        convs += [nn.Conv2d(c, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        c = 128
    return _conv_fc(in_shape, n_classes, convs, [])


def resnet18(in_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    from torchvision.models import resnet18 as tv_resnet18

    m = tv_resnet18(weights=None, num_classes=n_classes)
    if in_shape[0] != 3:
        m.conv1 = nn.Conv2d(in_shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


IMAGE_MODELS = {"lenet": lenet, "cnn_dpfl": cnn_dpfl, "cnn2": cnn2, "resnet18": resnet18}


def load_weights(model: nn.Module, path: str) -> tuple[int, int]:
    """Copy the tensors of a saved state_dict whose name and shape match; returns
    (loaded, skipped). A file with no matching tensor is a user error."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"model.weights={path!r}: file not found (a state_dict saved with torch.save)")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"model.weights={path!r}: not a readable torch state_dict ({type(e).__name__})") from None
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ConfigError(f"model.weights={path!r}: expected a state_dict (name -> tensor), got {type(state).__name__}")
    own = model.state_dict()
    match = {k: v for k, v in state.items() if k in own and isinstance(v, torch.Tensor) and v.shape == own[k].shape}
    if not match:
        raise ConfigError(f"model.weights={path!r}: no tensor matches the model's names and shapes")
    model.load_state_dict(match, strict=False)
    return len(match), len(own) - len(match)


def architecture(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """The model's layers, initialised from torch's generator, without
    ``model.weights``; under ``torch.device("meta")`` nothing is allocated (how
    :func:`sizes` counts parameters of any size)."""
    if cfg.name == "mlp":
        return mlp(in_shape, n_classes, cfg.hidden, cfg.batchnorm)
    if cfg.name not in IMAGE_MODELS:
        raise ValueError(cfg.name)  # config validation names the choices
    if len(in_shape) != 3:
        raise ConfigError(f"model.name={cfg.name!r} needs image inputs [C, H, W]; the data gives "
                          f"shape {tuple(in_shape)}: use model.name=mlp or an image dataset")
    try:
        model = IMAGE_MODELS[cfg.name](in_shape, n_classes)
        if torch.get_default_device().type != "meta":  # sizes(): the real build checks the fit
            model.eval()
            with torch.no_grad():
                model(torch.zeros(2, *in_shape))
    except RuntimeError:
        raise ConfigError(f"model.name={cfg.name!r} does not fit images of shape {tuple(in_shape)} "
                          "(too small for its convolutions and pooling); raise data.image_size "
                          "or choose another model") from None
    model.train()
    return model


def build(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int, seed: int) -> nn.Module:
    """Same seed -> same initial weights on every rank (one shared init)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = architecture(cfg, in_shape, n_classes)
    if cfg.weights:
        load_weights(model, cfg.weights)
    return model


def sizes(cfg: ModelConfig, in_shape: tuple[int, ...], n_classes: int) -> tuple[int, int]:
    """(parameters, buffer values) of the model, counted on the meta device: no
    memory is allocated, whatever ``model.hidden`` asks for."""
    with torch.device("meta"):
        model = architecture(cfg, in_shape, n_classes)
    return n_params(model), sum(b.numel() for b in model.buffers())


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def layers(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """(name, module, its parameters' names) of every module of ``model`` holding
    parameters of its own, from the input to the output."""
    out = []
    for name, mod in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in mod.named_parameters(recurse=False)]
        if own:
            out.append((name, mod, own))
    return out
