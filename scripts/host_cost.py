"""What a training step costs the host, counted on a CPU: how to steer a GPU step's speed without a GPU.

    python -m scripts.benchmark_notebook --host [--json F]
    python -m scripts.benchmark_notebook --host --processes 2 [--profile h100] [--engines ddp,zero2,zero3] [--json F]

At small shapes a GPU step is bound by the host: every op that launches a kernel, every read of a
device value (a sync: the host waits for every kernel queued before it) and every per-parameter
Python loop is paid each step. Here a dispatch mode (HostCounter) counts them per step and by part
for both sides at the published notebook's recipe (batch 16, its frames), the whole step as a GPU
runs it: the reference VAE's encode on the fly and the weight average every step included.

- **kernel ops**: aten ops that launch a kernel on a GPU: every op but views (`func.is_view`:
  view, reshape's view, transpose, slice, expand, ...) and the ops that only allocate or read
  metadata (NO_KERNEL). Elementwise ops that a GPU fuses nowhere count one each, as eager runs them.
- **views**: the view ops, each a host-side call with no kernel.
- **syncs**: reads of a device value on the host: `_local_scalar_dense` (`.item()`, `bool()`,
  `float()` of a tensor), `.tolist()`, `.cpu()`, `.numpy()`, and device synchronizes (torch's and
  DeepSpeed's accelerator's). Blocking host-to-device copies cannot be told apart on a CPU (every
  tensor is on it): not counted.
- **host ms**: the CPU time of the step's thread outside the ops (Python, autograd's and the
  dispatcher's bookkeeping between ops) at a 16x16 crop, less the counter's own cost per op
  dispatched (measured in the same process, `counter_overhead_s`), with glibc caching freed
  memory as CUDA's allocator does (CACHING_MALLOC). Thread CPU time, not wall time:
  on a shared machine another process's load stretches the wall clock between ops, not this
  thread's CPU time, so the ratio of the two sides holds from run to run.

The notebook's step is madebyollin/seraena's TAEHV_Training_Example.ipynb's Trainer.train_step
rebuilt from upstream's own taehv.py and seraena.py (scripts/benchmark_notebook.py: checkouts of
madebyollin/taehv and madebyollin/seraena): the student in fp32 under autocast (the notebook's
fp16 on CUDA; bf16 here, the same ops), its GradScaler, AdamW in its CUDA default (foreach), the
reference VAE (diffusers' AutoencoderKLWan, random weights) in bf16 and its AveragedModel updated
each step (the notebook averages every 2 s; the issue's count takes every step). Ours is the
trainer itself: training/loop/train.py's main, launched by accelerate with the profile's
accelerate file (1gpu_h100: one process, bf16 autocast; --set accelerate_config=... for another), its
fused AdamW (fused on every device, training/step/optimizer.py), the
seraena-notebook recipe at the notebook's shape, the same Wan VAE on the fly (bf16, as a GPU loads
it); counted inside train_step and the EMA's step. The two sides alternate step by step in that one
process (NotebookSide), each first every other step: each pair of steps meets the same load on a
shared machine, and neither side always follows the data loader's work. Both subtract the same
figure for the counter's own cost (measured beside each pair).

With --processes N (multi_process_costs): the same count per rank of a multi-process step, N CPU
processes over gloo under each engine (ENGINES: DDP, ZeRO-2, ZeRO-3; bf16 as the GPU profiles run),
at the notebook's recipe and at the profile's own step scaled down in space only (profile_shape_sets:
its batch, frames, accumulation and loss terms, its reference family as a full-size VAE with random
weights, 480x720 -> 32x48). Figures are per optimizer step and per rank; the notebook's side is
not run there (the one-process mode compares with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch (the worker): make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

aten = torch.ops.aten

# ops that allocate or read metadata: no kernel on a GPU
NO_KERNEL = {aten.empty, aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.empty_like, aten.detach,
             aten.lift_fresh, aten.set_, aten.resize_, aten._local_scalar_dense, aten.is_same_size, aten.sym_size,
             aten.sym_stride, aten.sym_numel, aten.sym_storage_offset, aten.is_nonzero, aten._has_compatible_shallow_copy_type}
HOST_READS = ("tolist", "cpu", "numpy")
WARMUP_STEPS = 2  # lazy initialisation, the first micro-step's warm-up of late terms, allocator growth
COUNTED_STEPS = 9
THREADS = 1  # intra-op threads of the worker (both sides): they speed the ops' arithmetic, which is not counted
SHAPE = {"batch": 16, "height": 16, "width": 16}  # the notebook's batch; a crop where the host's time dominates
# glibc as a caching allocator, as CUDA's is: a GPU reuses freed blocks without a system call, while
# glibc hands each block above its mmap threshold back to the OS when Python frees the tensor
# (munmap, between two ops: host time), and faults its pages in again at the next allocation. That
# cost grows with the tensors, not with the ops a GPU would launch. Below 32 MB (glibc's largest
# threshold) blocks stay in the heap, which is never trimmed.
CACHING_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_TOP_PAD_": str(256 << 20)}


class HostCounter(TorchDispatchMode):
    """Counts, while `counting`, the kernel ops, views and syncs of the ops dispatched under it, by part
    (`with counter.part(name)`); host reads and device synchronizes are counted through `patch_reads`."""

    def __init__(self):
        super().__init__()
        self.parts = ["other"]
        self.counting = False
        self.kernels, self.views, self.syncs = Counter(), Counter(), Counter()
        self.kernel_names = Counter()  # (part, op): which ops a part launches
        self.dispatched = Counter()  # by part: every op that went through the counter (its cost is paid per op)
        self.op_seconds: list[float] = []  # per counted step: inside the ops themselves (their arithmetic): not the host's
        self.ops_in_step: list[int] = []  # per counted step: the ops dispatched
        self.host_seconds = Counter()  # by part: the thread's CPU time between one op's end and the next op's start
        self.last_op_end = 0.0

    def start_step(self, new: bool = True) -> None:
        """The clock starts; `new`: a step of its own (else the current step goes on, as the EMA's after train_step)."""
        if new and self.counting:
            self.op_seconds.append(0.0)
            self.ops_in_step.append(0)
        self.last_op_end = CLOCK()

    @contextlib.contextmanager
    def part(self, name: str):
        self.parts.append(name)
        try:
            yield
        finally:
            self.parts.pop()

    def sync(self, what: str) -> None:
        if self.counting and not from_host_state():
            self.syncs[f"{self.parts[-1]}: {what} at {caller()}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.counting:
            return func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense:
            self.sync("_local_scalar_dense")
        elif func.is_view:
            self.views[self.parts[-1]] += 1
        elif packet not in NO_KERNEL:
            self.kernels[self.parts[-1]] += 1
            self.kernel_names[self.parts[-1], packet.__name__] += 1
        self.dispatched[self.parts[-1]] += 1
        self.ops_in_step[-1] += 1
        start = CLOCK()
        self.host_seconds[self.parts[-1]] += start - self.last_op_end  # the host's work since the last op
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.last_op_end = CLOCK()
            self.op_seconds[-1] += self.last_op_end - start

    def patch_reads(self) -> None:
        """Host reads (.tolist, .cpu, .numpy) and device synchronizes count as syncs."""
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(original, f".{name}()"))
        torch.cuda.synchronize = self._counted(torch.cuda.synchronize, "device synchronize")
        try:
            from deepspeed.accelerator import get_accelerator
        except ImportError:
            return
        accelerator = type(get_accelerator())
        accelerator.synchronize = self._counted(accelerator.synchronize, "device synchronize (DeepSpeed)")

    def _counted(self, original, what: str):
        def counted(*args, **kwargs):
            self.sync(what)
            return original(*args, **kwargs)

        return counted

    def wrap(self, owner, name: str, part: str) -> None:
        """owner.name runs as `part`."""
        original = getattr(owner, name)

        def in_part(*args, **kwargs):
            with self.part(part):
                return original(*args, **kwargs)

        setattr(owner, name, in_part)

    def per_step(self, steps: int, micro_steps_per_step: int, seconds: list[float], overhead: float) -> dict:
        """`seconds`: each counted step's CPU time on this thread (CLOCK); `overhead`: the counter's
        own cost per op (counter_overhead_s), the same figure for both sides of a comparison."""
        # each step's host time; the median step's is reported: another process's load still slows this
        # thread's CPU a little (shared caches and cores), on some steps more than on others
        by_step = [1000 * (total - inside - overhead * ops) for total, inside, ops in zip(seconds, self.op_seconds, self.ops_in_step)]
        host_ms = sorted(by_step)
        host_by_part = {part: value - overhead * self.dispatched[part] for part, value in self.host_seconds.items()}
        return {
            "kernel_ops_per_step": sum(self.kernels.values()) / steps,
            "kernel_ops_per_micro_step": sum(self.kernels.values()) / steps / micro_steps_per_step,
            "view_ops_per_step": sum(self.views.values()) / steps,
            "syncs_per_step": sum(self.syncs.values()) / steps,
            "host_ms_per_step": host_ms[len(host_ms) // 2],
            "host_ms_per_step_range": [host_ms[0], host_ms[-1]],
            "host_ms_by_step": by_step,
            "thread_cpu_ms_per_step_on_this_cpu": 1000 * sum(seconds) / steps,
            "counter_overhead_us_per_op": 1e6 * overhead,
            "kernel_ops_by_part": {part: count / steps for part, count in self.kernels.most_common()},
            "top_kernel_ops_by_part": {part: dict([(op, n / steps) for (where, op), n in self.kernel_names.most_common()
                                                   if where == part][:8]) for part in self.kernels},
            "host_ms_by_part": {part: 1000 * value / steps for part, value in sorted(host_by_part.items(), key=lambda kv: -kv[1])},
            "view_ops_by_part": {part: count / steps for part, count in self.views.most_common()},
            "syncs_by_where": {where: count / steps for where, count in self.syncs.most_common()},
        }


CLOCK = time.thread_time  # this thread's CPU time: the host's work, not the waits another process's load adds


def counter_overhead_s(ops: int = 5000, repeats: int = 3) -> float:
    """What the counter adds to one op on this thread: the same small ops with and without it, the
    least of `repeats` each (the quietest run is the closest to the cost itself)."""
    x = torch.ones(8)

    def run() -> float:
        start = CLOCK()
        for _ in range(ops):
            torch.add(x, x)
        return CLOCK() - start

    counter = HostCounter()
    plain, counted = [], []
    for _ in range(repeats):
        plain.append(run())
        with counter:
            counter.counting = True
            counter.start_step()
            counted.append(run())
    return max(0.0, (min(counted) - min(plain)) / ops)


COUNTER_FRAMES = {"sync", "__torch_dispatch__", "counted", "caller", "in_part"}


def caller() -> str:
    """file:line of the first frame outside torch, DeepSpeed, accelerate and the counter: who read the value."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if frame.f_code.co_name not in COUNTER_FRAMES and not any(part in path for part in ("/torch/", "/deepspeed/", "/accelerate/")):
            return f"{Path(path).name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def from_host_state() -> bool:
    """A read of a value that lives on the host on a GPU too: torch.optim's step counters (kept on the
    CPU unless fused or capturable), as tests/training_probe.py also excludes."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_get_value" and Path(frame.f_code.co_filename).parent.name == "optim":
            return True
        frame = frame.f_back
    return False


def wan_vae_folder(cache: Path) -> Path:
    """A full-size Wan 2.1 VAE (diffusers' AutoencoderKLWan() architecture, random weights, bf16),
    saved once: both sides encode with the same architecture."""
    folder = cache / "wan2.1-random" / "vae"
    if not (folder / "config.json").is_file():
        from diffusers import AutoencoderKLWan

        torch.manual_seed(0)
        AutoencoderKLWan().to(torch.bfloat16).save_pretrained(str(folder))
    return folder.parent


class NotebookSide:
    """The notebook's train_step (upstream's code, the module docstring), counted by its own counter:
    the reference encode on the fly, autocast (bf16 here, the notebook's fp16 on CUDA: the same ops)
    with its GradScaler, and its AveragedModel each step. It runs in our worker's process, one step
    before each of ours: both sides share the process, its threads and the machine's load of the moment."""

    def __init__(self, taehv_dir: Path, seraena_dir: Path, vae_folder: Path):
        from diffusers import AutoencoderKLWan

        from scripts.notebook_recipe import notebook_train_step

        vae = AutoencoderKLWan.from_pretrained(str(vae_folder / "vae"), torch_dtype=torch.bfloat16).eval().requires_grad_(False)
        self.counter = HostCounter()
        self.counter.patch_reads()  # beside ours: each counter counts only while it is counting
        with torch.random.fork_rng(devices=[]):  # the notebook seeds its own weights; our run's generators stay as they were
            self.train_step = notebook_train_step(taehv_dir, seraena_dir, torch.device("cpu"), size=SHAPE["height"], reference=vae,
                                                  amp_dtype=torch.bfloat16, average=True, part=self.counter.part)
        self.seconds: list[float] = []

    def step(self, counted: bool) -> None:
        counter = self.counter
        with counter:
            counter.counting = counted
            start = CLOCK()
            counter.start_step()
            self.train_step()
            if counted:
                self.seconds.append(CLOCK() - start)
            counter.counting = False

    def report(self, overhead: float) -> dict:
        return self.counter.per_step(len(self.seconds), 1, self.seconds, overhead)


def our_config_sets(vae_folder: Path, clips: Path) -> list[str]:
    """The seraena-notebook recipe at the notebook's shape (scripts/benchmark_notebook.py our_step),
    through the 1gpu_h100 profile: its engine, precision and optimizer."""
    from scripts.notebook_recipe import OUR_FRAMES

    return ["recipe=seraena-notebook", "use_ref_vae=true", "ref_vae_family=wan", "ref_vae_latent_space=raw",
            f"ref_vae_path={vae_folder}", "model_variant=taew2_1", "pretrained_model_path=", "reconstruction_weight=0",
            "perceptual_weight=0", "temporal_weight=0", f"batch_size_per_gpu={SHAPE['batch']}", f"n_frames={OUR_FRAMES}",
            f"height={SHAPE['height']}", f"width={SHAPE['width']}", "gradient_accumulation_steps=1", "global_batch_size=0",
            f"data_root={clips}", "num_workers=0", "validation_steps=1000", "checkpointing_steps=1000", "log_every=1000",
            f"max_steps={WARMUP_STEPS + COUNTED_STEPS}"]


def host_costs(profile: str, vae_folder: Path, work: Path, extra_sets: list[str], notebook: tuple[Path, Path] | None,
               processes: int = 1, sets: list[str] | None = None) -> dict:
    """{"ours": ..., "notebook": ...}. Ours: the trainer launched by accelerate with the profile's
    accelerate file, this module as the script (worker below), which counts inside the trainer's own
    step; the notebook's step (upstream's code in the checkouts `notebook`) alternates with ours in
    that process. notebook=None: ours alone, on `processes` ranks ({"ours": rank 0's, "ranks": each
    rank's}); `sets`: our config (default: the notebook's recipe, our_config_sets)."""
    from scripts.benchmark import free_port
    from training.config.load import load_config

    clips = sample_clips(work)
    sets = [*(sets if sets is not None else our_config_sets(vae_folder, clips)), *extra_sets]
    config = load_config(profile, sets, processes, check_paths=False)
    repo = Path(__file__).resolve().parents[1]
    report = work / "ours.json"
    for old in (report, *work.glob("ours.rank*.json")):
        old.unlink(missing_ok=True)
    shutil.rmtree(work / "run", ignore_errors=True)  # a fresh run each time
    sides = notebook if notebook is not None else ("-", "-")
    command = [sys.executable, "-m", "training.base.launch", "--config_file",
               str(repo / "accelerate_configs" / config.accelerate_config), "--num_processes", str(processes), "--num_machines", "1",
               "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
               str(Path(__file__).resolve()), "--worker", str(report), *map(str, (*sides, vae_folder)), "--config", profile, "--output-dir", str(work / "run"),
               *(arg for item in sets for arg in ("--set", item))]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(THREADS), **CACHING_MALLOC})
    if done.returncode != 0 or not report.is_file():
        raise RuntimeError(f"our step's count failed (exit {done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    costs = json.loads(report.read_text())
    costs["ours"]["engine"] = f"{config.accelerate_config} (ZeRO {config.zero_stage}, {config.mixed_precision})"
    if notebook is None:
        ranks = [costs["ours"]] + [json.loads((work / f"ours.rank{rank}.json").read_text())["ours"] for rank in range(1, processes)]
        costs["ranks"] = [{key: rank[key] for key in RANK_FIGURES} for rank in ranks]
    return costs


def sample_clips(work: Path) -> Path:
    from training.data.synthetic_clips import make_sample_videos

    clips = work / "clips"
    make_sample_videos(clips, count=2 * SHAPE["batch"] + 8, n_frames=24)  # a batch of training clips per rank beside the held-out ones
    return clips


# the engines a multi-process count compares: each a GPU profile's accelerate file (bf16), run on CPU processes over gloo
ENGINES = {"ddp": "ddp_gpu_bf16.yaml", "zero2": "deepspeed_8gpu.yaml", "zero3": "deepspeed_16gpu_zero3.yaml"}
RANK_FIGURES = ("kernel_ops_per_step", "view_ops_per_step", "syncs_per_step", "host_ms_per_step")
SPACE_SCALE = 15  # the profile's shape in space only: 480x720 -> 32x48 (multiples of the student's 8x; LPIPS's AlexNet needs 32)
PROFILE_SHAPE_STEPS = 3  # counted optimizer steps at the profile's shape (each is its accumulation's micro-steps)


def profile_shape_sets(profile: str, work: Path) -> list[str]:
    """The profile's own step scaled down in space only: its batch, frames, accumulation and loss terms
    (the perceptual term's LPIPS and its reference family with random weights, the student from
    scratch: the same ops), at height and width / SPACE_SCALE; data, validation and checkpoints out of
    the way."""
    from models.metrics import save_random_lpips_weights
    from training.config.load import load_config

    config = load_config(profile, [], check_paths=False)
    family = config.reference_family
    sets = [f"height={config.height // SPACE_SCALE}", f"width={config.width // SPACE_SCALE}",
            f"gradient_accumulation_steps={config.gradient_accumulation_steps}", "global_batch_size=0",
            "pretrained_model_path=", "latent_space_check=false", f"data_root={sample_clips(work)}", "num_workers=0",
            "validation_steps=1000", "checkpointing_steps=1000", "log_every=1000", f"max_steps={WARMUP_STEPS + PROFILE_SHAPE_STEPS}"]
    if config.use_ref_vae:
        sets += [f"ref_vae_path={full_size_vae_folder(family, work)}", "ref_vae_latent_space=raw"]
    if config.perceptual_weight > 0:
        backbone, heads = save_random_lpips_weights(work / "lpips")
        sets += [f"lpips_backbone_path={backbone}", f"lpips_weights_path={heads}"]
    return sets


def full_size_vae_folder(family: str, work: Path) -> Path:
    """The family's VAE at its full size (its diffusers class's default architecture), random weights in bf16."""
    if family == "wan":
        return wan_vae_folder(work)
    folder = work / f"{family}-random" / "vae"
    if not (folder / "config.json").is_file():
        from models.reference_vae import vae_class

        torch.manual_seed(0)
        vae_class(family)().to(torch.bfloat16).save_pretrained(str(folder))
    return folder.parent


def multi_process_costs(profile: str, work: Path, processes: int = 2, engines: tuple[str, ...] = tuple(ENGINES),
                        shapes: tuple[str, ...] = ("notebook_recipe", "profile_shape"), extra_sets: list[str] = ()) -> dict:
    """Per rank and per optimizer step, the profile's step on `processes` CPU processes under each
    engine, beside the same step in one process (no engine: the yardstick of issue 60's goal, at most
    1.2x its kernel-launching ops and 2 syncs): {shape: {"one_process": its figures, engine: {"ours":
    rank 0's figures, "ranks": each rank's, "over_one_process": rank 0's ops / the one process's}}}."""
    result = {"profile": profile, "processes": processes, "engines": {name: ENGINES[name] for name in engines}}
    for shape in shapes:
        sets = (our_config_sets(wan_vae_folder(work), sample_clips(work)) if shape == "notebook_recipe"
                else profile_shape_sets(profile, work))
        one = host_costs(profile, wan_vae_folder(work), work, [*extra_sets, f"accelerate_config={ENGINES['ddp']}",
                                                                "supported_num_gpus=1"], None, processes=1, sets=sets)["ours"]
        result[shape] = {"one_process": one}
        for name in engines:
            try:
                costs = host_costs(profile, wan_vae_folder(work), work, [*extra_sets, f"accelerate_config={ENGINES[name]}"], None,
                                   processes=processes, sets=sets)
            except RuntimeError as error:  # the other engines' counts still come back
                result[shape][name] = {"error": str(error)[-1500:]}
                continue
            result[shape][name] = {"ours": costs["ours"], "ranks": costs["ranks"],
                                   "over_one_process": costs["ours"]["kernel_ops_per_step"] / one["kernel_ops_per_step"]}
    return result


def worker(report: Path, taehv_dir: Path, seraena_dir: Path, vae_folder: Path, argv: list[str]) -> int:
    """Inside accelerate launch: the trainer's main with the counter around each train_step and EMA
    step, the notebook's step before each."""
    import training.loop.step as step_module
    import training.loop.train as loop
    from models.reference_vae import ReferenceVAE
    from training.step.ema import PartitionedEMA, WeightEMA
    from training.step.losses import Student

    import models.reference_vae as reference_module

    # the reference VAE in bf16 as on a GPU (on a CPU the trainer loads it in fp32, whose op
    # sequence differs: the casts the bf16 encode launches are part of the GPU's step)
    load = reference_module.load_reference_vae
    reference_module.load_reference_vae = lambda *args, **kwargs: load(*args, **{**kwargs, "dtype": torch.bfloat16})
    counter = HostCounter()
    counter.patch_reads()
    counter.wrap(ReferenceVAE, "encode", "reference_encode")
    counter.wrap(Student, "forward", "student_forward")
    counter.wrap(step_module, "forward_losses", "losses")  # the loss terms around the forward (its own part)
    counter.wrap(step_module, "add_seraena_term", "seraena")
    counter.wrap(step_module, "agree", "agreement")
    for ema in (WeightEMA, PartitionedEMA):
        counter.wrap(ema, "step", "ema")
    steps, seconds, overheads, last = [], [], [], [False]  # last: whether the latest train_step was counted
    train_step = loop.train_step
    notebook = NotebookSide(taehv_dir, seraena_dir, vae_folder) if str(taehv_dir) != "-" else None  # "-": ours alone

    def counted_step(run, batch):
        if not steps:  # the accelerator's backward and the optimizer's step, once built
            counter.wrap(run.accelerator, "backward", "backward")
            counter.wrap(run.optimizer, "step", "optimizer")
            counter.wrap(run.optimizer, "zero_grad", "optimizer")
        window = run.accelerator.gradient_accumulation_steps
        first = len(steps) % window == 0  # the micro-step that opens an optimizer step's window
        counted = len(steps) // window >= WARMUP_STEPS
        notebook_first = len(steps) % 2 == 0  # each side first every other step: neither always follows the loader's work
        if notebook is not None and notebook_first:
            notebook.step(counted)
        counter.counting = counted
        start = CLOCK()
        counter.start_step(new=first)
        with counter:
            result = train_step(run, batch)
        steps.append(window)
        counter.counting = False  # the loader's work between steps is not the step's
        if counted:
            if first:
                seconds.append(0.0)
                overheads.append(counter_overhead_s())  # beside each pair of steps: the machine's load of the moment
            seconds[-1] += CLOCK() - start
        if notebook is not None and not notebook_first:
            notebook.step(counted)
        last[0] = counted
        return result

    loop.train_step = counted_step
    for ema in (WeightEMA, PartitionedEMA):  # the EMA's step follows train_step, still counted
        original = ema.step

        def counted_ema(self, *args, original=original, **kwargs):
            counter.counting = last[0]
            start = CLOCK()
            counter.start_step(new=False)
            try:
                with counter:
                    return original(self, *args, **kwargs)
            finally:
                if counter.counting:
                    seconds[-1] += CLOCK() - start
                counter.counting = False

        ema.step = counted_ema
    code = loop.main(argv)
    counted = len(seconds)
    if code == 0:
        # one figure for the counter's own cost, subtracted alike from both sides (measured apart, at two
        # moments of a shared machine, it differed by more than the sides did)
        overhead = statistics.median(overheads)
        ours = counter.per_step(counted, steps[-1], seconds, overhead)
        if notebook is None:  # one report per rank
            rank = int(os.environ.get("RANK", "0"))
            (report if rank == 0 else report.with_name(f"{report.stem}.rank{rank}.json")).write_text(json.dumps({"ours": ours}))
            return code
        theirs = notebook.report(overhead)
        # each of our steps over the notebook's step just before it (the same moment's load), the median pair
        ratios = sorted(a / b for a, b in zip(ours["host_ms_by_step"], theirs["host_ms_by_step"]))
        report.write_text(json.dumps({"ours": ours, "notebook": theirs, "ours_over_notebook_host_ms": ratios[len(ratios) // 2]}))
    return code


def main(taehv_dir: Path, seraena_dir: Path, sets: list[str], profile: str = "1gpu_h100", work: Path | None = None,
         processes: int = 1, engines: tuple[str, ...] = tuple(ENGINES), shapes: tuple[str, ...] = ("notebook_recipe", "profile_shape")) -> dict:
    work = work or Path(os.environ.get("TMPDIR", "/tmp")) / "taehv_host_cost"
    work.mkdir(parents=True, exist_ok=True)
    if processes > 1:
        return multi_process_costs(profile, work, processes, engines, shapes, sets)
    return host_costs(profile, wan_vae_folder(work), work, sets, (taehv_dir, seraena_dir))


if __name__ == "__main__":
    from training.base.fast_exit import exit_now

    if len(sys.argv) > 5 and sys.argv[1] == "--worker":
        exit_now(worker(*map(Path, sys.argv[2:6]), sys.argv[6:]))
    raise SystemExit("run through python -m scripts.benchmark_notebook --host")
