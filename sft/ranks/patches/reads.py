"""The numbers the host reads from each step (the loss, TRL's metrics, the tokens, the gradient norm), read
without waiting for the GPU's queue.

`tensor.item()` waits until the GPU has run everything queued before it. TRL reads its metrics that way after each
forward, and the Trainer reads the gradient norm and the logged loss that way after each optimizer step: each time the
queue runs dry, and the GPU then waits while the host starts what comes next (DeepSpeed's backward hooks, the next
batch, the next forward's first layers). A `Read` copies a value into pinned host memory right after the GPU computes it
and marks that point with an event: reading it waits for that point only, which the GPU has passed by the time the host
asks (the forward's numbers at the step's end), or is about to (the norm, computed before the optimizer's kernel). With
the other waits removed as well (patches/: the LM head's and the mask's; one rank's overlap_comm off, planner/rules.py),
the defaults trained a few percent faster (measured: docs/speed.md,
'the host no longer waits for the GPU's queue inside a step').

`Trainer` is TRL's SFTTrainer with its numbers taken as Reads: its own `compute_loss` for the plain case
(TRL's, restated below: the fused LM head's loss and its entropy and token accuracy), the logged loss summed
from the Reads of the losses the backward was given, the gradient norm from the step (patches/zero_step.py's
one-pass step reads it), and the floating-point operations summed with the tokens. With several ranks the
numbers are summed over them on the GPU, with the step's other collectives, instead of gathered and read.
Any other case (sequence parallelism, a user's loss, label smoothing, an MoE's auxiliary loss) is TRL's own.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


class Read:
    """A tensor's value as the GPU computed it at this point of its queue; `value()` waits for that point."""

    def __init__(self, value: torch.Tensor):
        value = value.detach()
        if value.is_cuda:
            self.host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            self.host.copy_(value, non_blocking=True)
            self.done: torch.cuda.Event | None = torch.cuda.Event()
            self.done.record()
        else:  # CPU ranks: computed already
            self.host, self.done = value.clone(), None

    def value(self) -> torch.Tensor:
        if self.done is not None:
            self.done.synchronize()
            self.done = None
        return self.host

    def item(self) -> float:
        return self.value().item()


def summed_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """value summed over the ranks, queued on the GPU like the step's other collectives (a copy: the caller's
    tensor is the backward's)."""
    value = value.detach().to(torch.float64, copy=True)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def trainer_class():
    """The SFTTrainer subclass (TRL imports slowly: made when a rank builds its trainer)."""
    from trl import SFTTrainer

    class Trainer(SFTTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sp = getattr(self.accelerator, "parallelism_config", None)
            # decided once: the case restated below, else TRL's own compute_loss and the Trainer's own reads
            # SFTDEV_OWN_READS=1: TRL's and the Trainer's own reads, for a developer's comparison (tests/test_reads.py)
            self.reads = (os.environ.get("SFTDEV_OWN_READS") != "1" and self.is_deepspeed_enabled
                          and self.compute_loss_func is None and not self.aux_loss_enabled
                          and not (self.label_smoother is not None and self.args.loss_type == "nll")
                          and not (sp is not None and sp.sp_enabled))
            if not self.reads and self.args.process_index == 0:
                print("[rank 0] the step's numbers read by .item(): TRL's and the Trainer's own reads", flush=True)
            self._pending: list[Read] = []  # per micro-step: loss, then (below) the metrics' sums over ranks
            self._micro: torch.Tensor | None = None  # this micro-step's metrics, until its backward
            self._loss_since_log = 0.0
            self._flos_read = 0.0
            if self.reads:
                backward = self.accelerator.backward

                def backward_read(loss, **kwargs):  # the loss the Trainer accumulates: what it passes here
                    numbers = loss.detach().reshape(1).to(torch.float64)
                    if self._micro is not None:
                        numbers = torch.cat([numbers, self._micro])
                    self._micro = None
                    self._pending.append(Read(summed_over_ranks(numbers)))
                    return backward(loss, **kwargs)

                self.accelerator.backward = backward_read

        # TRL's counter, which ProgressCallback reads at each step: the Reads taken so far are counted first
        @property
        def _total_train_tokens(self) -> int:
            if self.__dict__.get("_pending"):
                self._take_reads()
            return self.__dict__.get("_tokens", 0)

        @_total_train_tokens.setter
        def _total_train_tokens(self, value: int) -> None:
            self.__dict__["_tokens"] = value

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if not self.reads or return_outputs or not self.model.training:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            # TRL 1.16's SFTTrainer.compute_loss, its path without a user's loss, label smoothing or MoE loss
            inputs["use_cache"] = False
            outputs = model(**inputs, fused_lm_head=True)
            per_token_loss = -outputs.log_probs  # zero on ignored positions
            if self.args.loss_type == "dft":
                per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
            num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
            loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * (self.accelerator.num_processes // self.get_tp_size())
            # its metrics, kept on the GPU: counted over every rank when read (_take_reads)
            if "attention_mask" in inputs:
                tokens = inputs["attention_mask"].sum()
            else:
                tokens = torch.full((), inputs["position_ids"].size(1), device=loss.device)
            metrics = torch.stack([outputs.label_mask.sum(), outputs.entropy.detach().sum(), outputs.is_top1.sum(),
                                   tokens]).double() * self._kept()
            flos = torch.full((1,), float(self.floating_point_ops(inputs)), device=loss.device, dtype=torch.float64)
            self._micro = torch.cat([metrics, flos])
            return loss

        def _kept(self) -> float:
            """0 where accelerate's gather_for_metrics, through which TRL counts its metrics, drops this rank's
            numbers (the last batch, where ranks short of rows train on copies of the first ones), else 1."""
            state = self.accelerator.gradient_state
            dropped = state.end_of_dataloader and state.remainder > 0 and self.accelerator.process_index >= \
                state.remainder
            return 0.0 if dropped else 1.0

        def _take_reads(self) -> None:
            """Each micro-step's numbers, as TRL and the Trainer would have counted them (the metrics over every
            rank; the loss as the mean over ranks of what each rank's backward was given)."""
            pending, self._pending = self._pending, []
            world = dist.get_world_size() if dist.is_initialized() else 1
            for read in pending:
                numbers = read.value().tolist()
                self._loss_since_log += numbers[0] / world
                if len(numbers) == 1:
                    continue
                valid, entropy, correct, tokens, flos = numbers[1:]
                self._metrics["train"]["entropy"].append(entropy / valid if valid > 0 else 0.0)
                self._metrics["train"]["mean_token_accuracy"].append(correct / valid if valid > 0 else 0.0)
                self._total_train_tokens += int(tokens) // self._tp_size
                self._flos_read += flos
            if pending:
                self._metrics["train"]["num_tokens"] = [self._total_train_tokens]

        def _clip_grad_norm(self, model):
            return self._step_norm() if self.reads else super()._clip_grad_norm(model)

        def _get_grad_norm(self, model, grad_norm=None):
            if not self.reads:
                return super()._get_grad_norm(model, grad_norm)
            return grad_norm if grad_norm is not None else self._step_norm()

        def _step_norm(self) -> Any:
            """The step's gradient norm, unread: the one-pass step's Read (zero_step.py), else DeepSpeed's."""
            engine = self.model_wrapped
            read = getattr(getattr(engine, "optimizer", None), "norm_read", None)
            return read if read is not None else engine.get_global_grad_norm()

        def store_flos(self) -> None:
            if not self.reads:
                return super().store_flos()
            self._take_reads()
            self.state.total_flos += self._flos_read  # every rank's, summed with the tokens
            self._flos_read, self.current_flos = 0.0, 0

        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                     start_time, learning_rate=None):
            # transformers 5.24's logging branch of this method, the loss and norm taken from Reads; the
            # Trainer's own then finds the step logged and goes on to evaluate and save
            if self.reads and self.control.should_log and self.state.global_step > self._globalstep_last_logged:
                self._take_reads()
                loss, self._loss_since_log = self._loss_since_log, 0.0
                tr_loss.zero_()  # the Trainer's running sum on the GPU, reset as it resets it
                logs: dict[str, float] = {"loss": loss / (self.state.global_step - self._globalstep_last_logged)}
                if grad_norm is not None:
                    logs["grad_norm"] = grad_norm.item() if hasattr(grad_norm, "item") else grad_norm
                logs["learning_rate"] = learning_rate if learning_rate is not None else self._get_learning_rate()
                self._total_loss_scalar += loss
                self._globalstep_last_logged = self.state.global_step
                self.store_flos()
                self.log(logs, start_time)
            return super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                                    start_time, learning_rate=learning_rate)

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if self.reads and self.model.training:
                self._take_reads()  # TRL averages its metrics' lists here
            return super().log(logs, start_time)

    return Trainer
