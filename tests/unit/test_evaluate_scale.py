"""``lightrail evaluate`` at scale (issue 13 §2): generated schedules priced by class of ranks
give the per-rank results, the rail fabric is sized from the job, ``--fabric rail:HOSTSxGPUS``
is parsed and checked, and a replay larger than its fabric says which one fits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lightrail.agents.replay.evaluate import (
    EvaluationConfig,
    EvaluationError,
    Policy,
    evaluate,
    evaluate_main,
)
from lightrail.agents.replay.rank_view import per_rank_view, schedule_view
from lightrail.agents.replay.replayer import FabricTooSmall, HostSlot, Replayer
from lightrail.agents.replay.trace import read_aicb_csv, read_simai
from lightrail.agents.replay.trace.megatron import (
    Demand,
    GroupKind,
    MegatronSchedule,
    ParallelLayout,
    expand_per_rank,
)
from lightrail.agents.replay.trace.model import (
    CommOp,
    Direction,
    ScheduledRanks,
    SourceFormat,
    Workload,
)
from lightrail.agents.replay.trace.simai_scale import scale_simai, scaled_simai_header
from lightrail.controller.cli.main import main as cli_main
from lightrail.controller.cli.replay import replay_main
from lightrail.controller.domain.fabric import (
    FabricError,
    RailShape,
    rail_shape,
    rail_shape_for,
)
from lightrail.controller.domain.model import Collective

REPO = Path(__file__).resolve().parents[2]
SHARED_SIMAI = REPO.parent / "shared" / "data" / "workloads" / "aicb" / \
    "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt"
needs_shared = pytest.mark.skipif(not SHARED_SIMAI.is_file(),
                                  reason=f"shared SimAI workload not present at {SHARED_SIMAI}")

HEADER = "comm_type,comm_group,comm_group_size,msg_size,stage,dst,src,additional,_elapsed_time," \
    "algbw,busbw,count"


def _row(comm_type: str, group: str, size: str, msg: str, additional: str = "") -> str:
    return f"{comm_type},{group},{size},{msg},step,None,None,{additional},None,None,None,1"


EPOCH_END = _row("CommType.epoch_end", "None", "None", "0")


def per_rank(workload: Workload) -> Workload:
    """The same workload with every rank's sequence materialized (the per-rank path)."""
    assert isinstance(workload.ranks, ScheduledRanks)
    return dataclasses.replace(workload, ranks=dict(workload.ranks))


def same_evaluation(workload: Workload, config: EvaluationConfig | None = None) -> None:
    """Pricing ``workload`` by class and rank by rank gives the same evaluation."""
    by_class = evaluate(workload, config)
    by_rank = evaluate(per_rank(workload), config)
    assert dataclasses.replace(by_class, elapsed_s=0.0) == dataclasses.replace(by_rank,
                                                                               elapsed_s=0.0)


def pipeline_csv(tmp_path: Path) -> Path:
    """TP 2 x DP 2 x PP 4 (16 ranks): sends both ways, a DP all-reduce, a TP all-gather."""
    rows = [
        EPOCH_END,
        _row("CommType.all_gather", "CommGroup.tp_group", "2", "4096"),
        _row("CommType.isend", "CommGroup.pp_group", "4", "2000000", "send_next"),
        _row("CommType.irecv", "CommGroup.pp_group", "4", "2000000", "recv_prev"),
        _row("CommType.all_reduce", "CommGroup.dp_group", "2", "8000000"),
        _row("CommType.isend", "CommGroup.pp_group", "4", "1000000", "send_prev"),
        EPOCH_END,
    ]
    path = tmp_path / "pipeline.csv"
    path.write_text("\n".join(["[rank0 ~ rank15]", HEADER, *rows]) + "\n")
    return path


# --- the class-based schedule ------------------------------------------------------------------


def test_schedule_gives_every_rank_the_per_rank_sequence_and_blocks_by_stage() -> None:
    layout = ParallelLayout(tp=2, dp=4, pp=3, ep=2)
    demands = [
        Demand(1, Collective.ALL_REDUCE, GroupKind.TP, 64, 1e-6),
        Demand(2, Collective.SEND_RECV, GroupKind.PP, 32, 0.0, Direction.SEND, 1),
        Demand(3, Collective.ALL_TO_ALL, GroupKind.EP, 96, 2e-6),
        Demand(4, Collective.ALL_GATHER, GroupKind.EP_DP, 100, 0.0),
        Demand(5, Collective.SEND_RECV, GroupKind.PP, 32, 0.0, Direction.RECV, -1),
        Demand(6, Collective.REDUCE_SCATTER, GroupKind.DP, 800, 3e-6),
    ]
    schedule = MegatronSchedule(demands, layout)
    expected = expand_per_rank(demands, layout)
    assert {r: schedule.ops_of(r) for r in range(layout.world_size)} == expected
    # stage 0 has no previous stage, stage 2 no next: three blocks of 8 ranks
    assert schedule.blocks() == (range(0, 8), range(8, 16), range(16, 24))
    for b, block in enumerate(schedule.blocks()):
        for index in range(len(expected[block.start])):
            assert schedule.groups_at(b, index) == {expected[r][index].group for r in block}
    with pytest.raises(KeyError):
        schedule.ops_of(layout.world_size)


def test_an_embedding_group_over_more_than_two_stages_is_read_rank_by_rank() -> None:
    layout = ParallelLayout(tp=1, dp=1, pp=3)
    demands = [Demand(1, Collective.ALL_REDUCE, GroupKind.EMBEDDING, 64, 0.0)]
    with pytest.raises(ValueError, match="embedding group"):
        MegatronSchedule(demands, layout)


def test_readers_return_schedules_that_price_as_the_per_rank_sequences(tmp_path: Path) -> None:
    workload = read_aicb_csv(pipeline_csv(tmp_path))
    assert workload.schedule is not None
    assert len(workload.ranks) == 16 and 15 in workload.ranks and 16 not in workload.ranks
    view = schedule_view(workload, workload.schedule, None)
    assert view is not None
    assert view.groups_at is None  # first and last stage drop a send: the sequences differ
    reference = per_rank_view(per_rank(workload), None)
    assert (view.reps, view.members) == (reference.reps, reference.members)
    assert list(view.members.values()) == [4, 8, 4]  # first stage, middle stages, last stage
    same_evaluation(workload)
    same_evaluation(workload, EvaluationConfig(max_ops=2, delays_ms=(10.0,)))


def _simai_line(name: str, fwd: str, ig: str, wg: str) -> str:
    return "\t".join([name, "-1", *fwd.split(), *ig.split(), *wg.split(), "100"])


def whole_model_simai(tmp_path: Path, blocks: int) -> Path:
    """A whole-model SimAI file (TP 2, pp 1) in AICB's layout: gradient norms, one microbatch
    (embedding_layer, ``blocks`` x (attention_layer, mlp_layer), embedding_norm), cross
    entropy; the grad_norm sizes say 1e6 parameters, the embedding 2 x 1000 / 2 of them."""
    lines = [_simai_line("grad_norm", "1 ALLGATHER 2000000", "1 NONE 0", "2 REDUCESCATTER 4000000"),
             _simai_line("layernorm", "1 NONE 0", "1 ALLREDUCE 2000000", "1 NONE 0"),
             _simai_line("embedding_layer", "10 ALLREDUCE 16777216", "20 ALLREDUCE 16777216",
                         "30 NONE 0")]
    for _ in range(blocks):
        lines.append(_simai_line("attention_layer", "1000 ALLREDUCE 16777216",
                                 "2000 ALLREDUCE 16777216", "3000 NONE 0"))
        lines.append(_simai_line("mlp_layer", "500 ALLREDUCE 16777216",
                                 "600 ALLREDUCE 16777216", "700 NONE 0"))
    lines += [_simai_line("embedding_norm", "5 ALLREDUCE 1000", "6 NONE 0", "7 NONE 0"),
              _simai_line("cross_entropy1", "8 ALLREDUCE 8192", "9 NONE 0", "4 NONE 0")]
    source = tmp_path / "whole_A100.txt"
    source.write_text("\n".join(["HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 "
                                 "checkpoints: 0 checkpoint_initiates: 0", str(len(lines)),
                                 *lines]) + "\n")
    return source


@pytest.mark.parametrize(("world", "pp"), [(96, 4), (192, 12), (1152, 3)])
def test_scaled_simai_with_a_pipeline_prices_as_the_per_rank_sequences(
    tmp_path: Path, world: int, pp: int
) -> None:
    scaled = scale_simai(whole_model_simai(tmp_path, 12), tmp_path / f"l_{world}.txt",
                         world_size=world, pp=pp)
    workload = read_simai(scaled)
    schedule = workload.schedule
    assert workload.world_size == world and schedule is not None
    assert any(f"pp={pp}: the layer lines are one stage's" in a for a in workload.assumptions)
    assert any("pp_comm 16777216 B" in a for a in workload.assumptions)
    view = schedule_view(workload, schedule, None)
    reference = per_rank_view(per_rank(workload), None)
    assert view is not None
    assert (view.reps, view.members) == (reference.reps, reference.members)
    # every stage waits differently for the pipeline: one class per stage
    assert list(view.members) == [s * world // pp for s in range(pp)]
    assert view.groups_at is None and reference.groups_at is None  # boundary stages differ
    same_evaluation(workload, EvaluationConfig(delays_ms=(1.0, 100.0)))


def test_a_pipeline_makes_the_rails_switch_between_pp_pairs_and_the_dp_ring(
    tmp_path: Path,
) -> None:
    scaled = scale_simai(whole_model_simai(tmp_path, 12), tmp_path / "l_192.txt",
                         world_size=192, pp=4)
    result = evaluate(read_simai(scaled), EvaluationConfig(delays_ms=(10.0,)))
    on_demand = result.result(Policy.ON_DEMAND, 10.0)
    provisioning = result.result(Policy.PROVISIONING, 10.0)
    ideal = result.result(Policy.IDEAL_EPS, 10.0)
    assert on_demand.reconfigurations == provisioning.reconfigurations == 4
    assert on_demand.exposed_delay_s == pytest.approx(4 * 0.010)
    assert provisioning.exposed_delay_s < on_demand.exposed_delay_s
    assert ideal.iteration_s is not None and provisioning.iteration_s is not None
    assert on_demand.iteration_s is not None
    assert ideal.iteration_s < provisioning.iteration_s < on_demand.iteration_s


def test_scaled_header_follows_aicb_and_checks_its_degrees() -> None:
    header = scaled_simai_header("HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 "
                                 "checkpoints: 0 checkpoint_initiates: 0",
                                 world_size=9216, pp=12, pp_comm_bytes=16777216)
    assert header == ("HYBRID_TRANSFORMER_FWD_IN_BCKWD\tmodel_parallel_NPU_group: 2 ep: 1 pp: 12 "
                      "vpp: 1 ga: 1 all_gpus: 9216 checkpoints: 0 checkpoint_initiates: 0 "
                      "pp_comm: 16777216")
    with pytest.raises(ValueError, match="world_size: 100 is not a multiple of tp 2 x pp 12"):
        scaled_simai_header(header, world_size=100, pp=12)
    with pytest.raises(ValueError, match="ep: 5 does not divide"):
        scaled_simai_header(header, world_size=16, ep=5)


@needs_shared
def test_the_9216_gpu_simai_workload_is_priced_by_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="pp: 12 does not divide the 32 transformer layers"):
        scale_simai(SHARED_SIMAI, tmp_path / "l7b_9216.txt", world_size=9216, pp=12)
    scaled = scale_simai(SHARED_SIMAI, tmp_path / "l7b_9216.txt", world_size=9216, pp=8)
    assert evaluate_main(scaled, [10.0], None, as_json=True) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["world_size"], data["fabric"], data["hosts"]) == (9216, "rail-1152x8", 1152)
    # one class per stage of 1152 ranks; the first and last lack one neighbour's 2 transfers
    reps = data["representatives"]
    assert [(r["rank"], r["ranks"], r["ops"]) for r in reps] == \
        [(s * 1152, 1152, 32 if s in (0, 7) else 34) for s in range(8)]
    at10 = {r["policy"]: r for r in data["results"]}
    assert at10["on_demand"]["reconfigurations_per_iteration"] == 4
    assert at10["ideal_eps"]["iteration_ms"] < at10["provisioning"]["iteration_ms"] \
        < at10["on_demand"]["iteration_ms"]
    assert data["load_s"] >= 0 and data["peak_rss_mib"] > 0
    assert evaluate_main(scaled, [10.0], None) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fabric rail-1152x8 sized from the job: 1152 hosts x 8 GPUs" in out
    assert "wall time" in out and "peak memory" in out and "MiB (ru_maxrss" in out


# --- fabric sizing and --fabric ------------------------------------------------------------------


def test_rail_fabric_is_sized_from_the_world_size() -> None:
    assert rail_shape_for(8).name == "demo-4x2"
    assert rail_shape_for(128).name == "rail-16x8"
    assert rail_shape_for(9216) == RailShape("rail-1152x8", 1152, 8)
    assert rail_shape_for(1001) == RailShape("rail-143x7", 143, 7)  # 7 divides 1001, 8 not
    assert rail_shape_for(262, gpus_per_host=4) == RailShape("rail-131x2", 131, 2)
    with pytest.raises(FabricError, match="more than 65536"):
        rail_shape_for(65_537 * 8)
    fabric = rail_shape("rail:1152x8").fabric(0.01)
    assert (len(fabric.hosts), len(fabric.switches)) == (1152, 8)
    assert fabric.switches["ocs-rail0"].capabilities.port_count == 1152


def test_rail_specs_parse_and_bad_ones_name_the_value() -> None:
    assert rail_shape("rail:16x8").name == "rail-16x8"  # the built-in of that shape
    assert rail_shape("rail-32x4").option == "rail:32x4"
    for bad, reason in (("rail:0x8", "hosts must be 1..65536, got 0"),
                        ("rail:4x0", "GPUs per host must be 1..64, got 0"),
                        ("rail:4x", "expected a built-in fabric"),
                        ("rack-4x2", "expected a built-in fabric"),
                        # review of issue 13: digits of other scripts read as 1 (rail-1x8)
                        ("rail:\u0661x8", "expected a built-in fabric")):
        with pytest.raises(FabricError, match=reason) as err:
            rail_shape(bad)
        assert repr(bad) in str(err.value)
    with pytest.raises(EvaluationError, match=r"fabric: fabric 'rail:0x8': hosts must be"):
        EvaluationConfig(fabric="rail:0x8")


def test_cli_fabric_option_is_checked_naming_option_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path = pipeline_csv(tmp_path)
    for command in ("evaluate", "replay"):
        with pytest.raises(SystemExit) as exit_:
            cli_main([command, str(csv_path), "--fabric", "rail:3x99"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "argument --fabric: fabric 'rail:3x99': GPUs per host must be 1..64" in err
    assert cli_main(["evaluate", str(csv_path), "--fabric", "rail:4x4", "--delay-ms", "10",
                     "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["fabric"], data["hosts"], data["world_size"]) == ("rail-4x4", 4, 16)


def test_evaluate_on_a_named_fabric_too_small_says_which_fits(tmp_path: Path) -> None:
    workload = read_aicb_csv(pipeline_csv(tmp_path))
    with pytest.raises(EvaluationError, match="fabric offers 4 hosts x 2 GPUs = 8") as err:
        evaluate(workload, EvaluationConfig(fabric="demo-4x2"))
    assert str(err.value).endswith("a fabric that fits: --fabric rail-16x8 (16 hosts x 8 GPUs "
                                   "= 128)")


# --- replay of a job larger than its fabric ------------------------------------------------------


@needs_shared
async def test_replay_larger_than_its_fabric_names_the_fabric_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scaled = scale_simai(SHARED_SIMAI, tmp_path / "l7b_256.txt", world_size=256, pp=2)
    for fabric in (None, "rail-16x8", "rail:8x8"):
        rc = await replay_main(scaled, controller=None, fabric=fabric, delay_ms=1.0,
                               iterations=1, time_scale=0.0, job_id="big", as_json=False,
                               progress=False)
        assert rc == 2
        err = " ".join(capsys.readouterr().err.split())
        in_use = rail_shape(fabric or "rail-16x8")
        assert (f"job has 256 ranks but fabric {in_use.name} offers {in_use.hosts} hosts x "
                f"8 GPUs = {in_use.gpus}") in err
        assert "a fabric that fits: --fabric rail:32x8 (32 hosts x 8 GPUs = 256)" in err
        assert f"--fabric {in_use.option} " not in err and not err.endswith(in_use.option)


def test_replayer_refuses_a_job_larger_than_the_controllers_fabric_before_expanding() -> None:
    layout = ParallelLayout(tp=2, dp=64, pp=2)
    demands = [Demand(1, Collective.ALL_REDUCE, GroupKind.DP, 1024, 0.0)]

    class Counting(MegatronSchedule):
        asked = 0

        def ops_of(self, rank: int) -> tuple[CommOp, ...]:
            Counting.asked += 1
            return super().ops_of(rank)

    workload = Workload("big", SourceFormat.SYNTHETIC, 256,
                        ScheduledRanks(Counting(demands, layout)))
    hosts = [HostSlot(f"host{i}", tuple(range(8))) for i in range(16)]
    with pytest.raises(FabricTooSmall) as err:
        Replayer(workload, "127.0.0.1:1", hosts)
    assert (err.value.world_size, err.value.capacity) == (256, 128)
    assert Counting.asked == 0


def test_replay_against_a_controller_too_small_points_to_a_fabric_that_fits() -> None:
    from lightrail.controller.cli.replay import _replayer_error

    line = _replayer_error(FabricTooSmall(256, 16, 8), "rail-16x8", "10.0.0.1:50051",
                           external=True)
    assert line == (
        "lightrail replay: job has 256 ranks but the fabric offers 16 hosts x 8 GPUs = 128 "
        "(fabric rail-16x8 of the controller at 10.0.0.1:50051); replay against a controller "
        "whose fabric has at least 256 GPUs, or without --controller with --fabric rail:32x8 "
        "(32 hosts x 8 GPUs = 256) for an embedded one that fits")


def test_cli_delay_above_the_configs_bound_is_refused_naming_option_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # review of issue 13: replay and emulate passed 1e9 ms on to the config, whose pydantic
    # ValidationError came out as a traceback
    csv_path = pipeline_csv(tmp_path)
    for argv in (["replay", str(csv_path)], ["emulate"]):
        with pytest.raises(SystemExit) as exit_:
            cli_main([*argv, "--delay-ms", "1e9"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "argument --delay-ms: must be <= 600000 ms (MAX_RECONFIGURATION_DELAY_MS), got 1e9" \
            in err, err
