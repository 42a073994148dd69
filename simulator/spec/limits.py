"""The largest sizes the simulator accepts, and why each bound is where it is.

Every size a user controls is bounded: past these, no training run that exists is described, and
some would take minutes or gigabytes to answer (the engine plays every micro-batch of every stage;
the search tries every number of checkpointed layers). A value past a bound is refused with one
sentence naming it and the bound, never a hang or a crash.
"""

from __future__ import annotations

# --- the cluster and the plan --------------------------------------------------------------------

MAX_GPUS = 1_048_576
"""GPUs of one job (2**20): five to ten times the largest training clusters built (100,000 to 200,000
GPUs). The cost of an answer does not set it: a group's rings are routed over its two-node image, or,
when its stride is neither a multiple nor a divisor of a node's GPUs or its last node is only partly
its own (the tied embedding's all-reduce and the data-parallel groups when a stage's GPUs are not
whole nodes), in closed form over the nodes near its two ends and one period of its middle, a cost set
by the node and the scalable unit. So a cold estimate of GPT-3 175B at TP 8, PP 16 takes 20-30 ms and
under 70 MB at 1,024, 262,144 and 1,048,576 GPUs alike, and one of GPT-3 2.7B at TP 1, PP 32 25-35 ms
and under 65 MB at 100,000 and 1,000,000 GPUs (measured; routed GPU by GPU, as before, those took 15 s
and 0.9 GB, and 3 minutes and 7.7 GB)."""

MAX_GPUS_PER_NODE = 1_024
"""GPUs of one NVLink domain (a "node"); NVL72 racks hold 72, announced ones 576."""

MAX_MESH_GPUS_PER_NODE = 16
"""GPUs of a node without NVSwitch, where every pair has its own link (DGX-1's mesh has 8): the graph
holds n^2 links per node."""

MAX_PIPELINE_CHUNKS = 262_144
"""Forward steps of one pipeline per iteration: stages x virtual stages x micro-batches (2**18).
The engine plays each (forward and backward) at a few microseconds and some hundred bytes; published
runs play at most tens of thousands (Megatron 1T: 64 stages x 512 micro-batches = 32,768)."""

MAX_MICRO_BATCH_SIZE = 65_536
"""Sequences per micro-batch (2**16); published runs use 1 to 16."""

MAX_GLOBAL_BATCH_SIZE = 16_777_216
"""Sequences per iteration (2**24); published runs use at most a few thousand."""

MAX_TOKENS = 1e15
"""Training tokens (a quadrillion); the largest published runs train on a few tens of trillions."""

# --- the model -----------------------------------------------------------------------------------

MAX_LAYERS = 1_024
"""Transformer layers; published GPTs have at most about 130 (Megatron 1T: 128, Llama 3 405B: 126).
The search tries every number of checkpointed layers of a chunk, so it grows with this."""

MAX_HIDDEN_SIZE = 262_144
"""Hidden size (2**18); Megatron 1T has 25,600."""

MAX_FFN_HIDDEN_SIZE = 1_048_576
"""MLP inner size (2**20); Llama 3 405B has 53,248."""

MAX_VOCAB_SIZE = 4_194_304
"""Vocabulary (2**22); tokenizers in use have at most a few hundred thousand entries."""

MAX_SEQ_LENGTH = 16_777_216
"""Sequence length in tokens (2**24); long-context models reach a few million."""

MAX_ROTARY_BASE = 10**12
"""Rotary base (rope theta); published models use 10,000 to a few million (Llama 3: 500,000)."""

MAX_ROPE_SCALING_FACTOR = 1_024.0
"""Rope scaling factor (Llama 3.1's is 8)."""

MAX_LAYERS_PER_LIST = MAX_LAYERS
"""Entries of a per-stage layer split (one per stage, so at most one per layer)."""

MAX_EXPERTS = 65_536
"""Routed experts of one MoE layer, and experts a token is routed to (2**16); DeepSeek-V3 routes over 256,
the most fine-grained published designs over a few thousand."""

MAX_EXPERT_LOAD = 1_000.0
"""Tokens an expert takes as a multiple of its balanced share: the load imbalance to plan for
(``--moe-load-imbalance``) and the capacity factor. At a thousand times its share the busiest rank
of a thousand ranks takes every token; measured imbalances are 1.1 to a few."""

# --- physical ranges of hardware numbers ---------------------------------------------------------
# Wide enough for a CPU core and for hardware not yet built, narrow enough that no time or byte
# count the models derive from a spec sheet or a profile overflows or loses meaning.

TFLOPS_RANGE = dict(ge=1e-3, le=1e6)
"""A peak, TFLOP/s: a GFLOP/s core to a million TFLOP/s."""

GBPS_RANGE = dict(ge=1e-3, le=1e6)
"""A bandwidth, GB/s: a MB/s to a PB/s."""

FRACTION_RANGE = dict(ge=1e-6, le=1)
"""A fraction of a peak that hardware achieves: at least a millionth."""

CACHED_FRACTION_RANGE = dict(ge=1e-6, le=100)
"""Achieved over peak memory bandwidth of a kernel whose working set stays in an on-chip cache, which
can stream faster than the memory behind it (a CPU core's L2 several times its share of DRAM)."""

FIXED_SECONDS_RANGE = dict(ge=0, le=1.0)
"""A fixed cost per kernel or per message, seconds."""

SIZE_RANGE = dict(ge=0, le=1e15)
"""Where a curve bends, in elements or bytes."""

MEASURED_SECONDS_RANGE = dict(gt=0, le=86_400.0)
"""A time measured once (a kernel, a collective, an iteration, a timer's total), seconds: under a day, for
no step of a training run that is timed takes longer."""

FIT_VALUE_RANGE = dict(ge=0, le=1e15)
"""A value of a point a profile was fitted to: a size in elements or bytes, a count, a 0/1 flag, a time or a
bandwidth; none is negative and none is larger than a size (``SIZE_RANGE``)."""

LOAD_AVERAGE_RANGE = dict(ge=0, le=1e6)
"""A machine's load average (runnable threads): a million is past any machine built."""

MAX_THREADS = 1_024
"""Torch threads of one process (``simulator reference --threads``): more cores than one machine has."""

MAX_CORES = 1_048_576
"""CPU cores of one machine, as ``os.cpu_count()`` reports them (2**20)."""

# --- failures and checkpoints (simulator.estimator.goodput) ---------------------------------------

MAX_MTBF_GPU_HOURS = 1e9
"""One GPU's mean time between interruptions, GPU-hours (``--mtbf-gpu-hours``): 100,000 years, past which a job
of any size the simulator accepts sees none; published fleets give tens of thousands (Llama 3: about 50,000)."""

MAX_SAVE_INTERVAL = 2**31 - 1
"""Iterations between checkpoints (``--save-interval``): Megatron reads it as a C int."""

MAX_SPARE_NODES = MAX_GPUS
"""Hot spare nodes kept beside the job (``--spare-nodes``): no more than the GPUs of the largest job."""

MAX_SLOWDOWN_BY_FAILURES = 100.0
"""Expected days over the days without interruptions (compute and saves) past which a job is refused: it fails
more often than it can restart and save, so it would almost never finish (the expectation grows as
e^(restart / MTBF))."""

MAX_SIMULATED_INTERRUPTIONS = 2_000_000
"""Interruptions the simulation plays over all its runs (about 5 microseconds each); a job expected to see more
in one run than a tenth of this is not simulated (its spread is then under a percent, the closed form's
mean holds)."""

MAX_GOODPUT_RUNS = 10_000
"""Runs of the whole job the simulation plays for its percentiles."""

# --- files ---------------------------------------------------------------------------------------

MAX_INPUT_FILE_BYTES = 16 * 1024 * 1024
"""A model, cluster, profile, run record or raw-points file (16 MiB): the shipped profiles are about
20 KB and a measured raw-points file a few hundred KB."""

MAX_SCRIPT_NESTING = 64
"""If-blocks inside if-blocks, and ``${NAME:-...}`` defaults inside defaults, of a Megatron launch script
(``--megatron-args``), counted together. The reader follows each level by calling itself (three to five Python
frames a level), so at this bound a script takes at most some 300 of Python's 1,000 frames, and one nested
hundreds deep is refused in one sentence instead of crashing; launch scripts nest two or three levels."""

MAX_SCRIPT_EXPANSION_BYTES = 16 * 1024 * 1024
"""Characters the variables and arrays of a launch script may expand to, counted over the whole script (16 MiB,
as large as the largest input file). ``A=$A$A`` doubles a value on each line, so forty such lines would ask for a
terabyte; Megatron-LM's example scripts expand to a few kilobytes."""

MAX_FILE_NAME_BYTES = 255
"""One path component (NAME_MAX of Linux, macOS and Windows file systems)."""

MAX_PATH_BYTES = 4_096
"""A whole path (PATH_MAX of Linux)."""

# --- CLI-only knobs ------------------------------------------------------------------------------

MAX_TOP = 1_000
"""Plans `simulator search --top` lists (each is simulated by the engine)."""

MAX_ITERATIONS = 10_000
"""Iterations of `simulator reference`."""

MAX_BUDGET_S = 7 * 86_400.0
"""Wall-clock allowance of `simulator calibrate --budget-s` (a week)."""

MAX_SEED = 2**63 - 1
"""`simulator reference --seed`: torch's generators take a 64-bit seed."""

MAX_DDP_BUCKET_SIZE = 2**40
"""Parameters of one gradient bucket (about 1.1e12): past every model the simulator accepts, so a bucket
this size holds a whole model and nothing larger means anything; the flag and a plan file share it."""
