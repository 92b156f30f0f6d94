"""The optimal planner: a clock for every unit, least iteration energy within a time budget.

Method (docs/optimal-planner.md has the long form):

1. Menus (menus.py): with the unit order fixed, energy = sum_u (e_u - P t_u) + S P T, a discrete
   time-cost trade-off on the DAG. Per (stage, kind) only Pareto clocks matter.
2. LP relaxation (lp.py): convex hull of each menu, precedence edges, makespan <= budget, solved
   with HiGHS on sparse matrices, on a periodic fold of the middle micro-batches when M is large
   (fold.py). Gives fractional durations, and a lower bound when not folded.
3. Rounding, three ways, keeping the best result: (a) each unit takes the slowest menu clock not
   slower than its LP duration (durations only shrink, so the budget holds); (b) error diffusion along
   each stage (on DAGs above _FULL_HULL_UNITS: on-time rounding, each unit ending by its end in the LP's
   schedule, which needs no repair); (c) each unit takes the clock nearest its LP duration (small DAGs); then
   *repair* speeds up the critical units with the least extra cost per second saved until the simulated time
   meets the budget exactly.
4. Improve: alternately give each unit its *free float* in the earliest schedule and in the latest
   schedule (slack it can take without moving any other unit), choosing the cheapest clock that fits.
   Slowing every unit within its own free float at once never moves another unit, so every pass is
   safe; passes repeat until nothing changes. Float that lengthens the iteration costs every stage's
   blocking power, which can outweigh what the units save: each rounding is kept improved or not,
   whichever costs less (the best feasible).
5. Polish (small DAGs): a large-neighbourhood search, the exact MILP restricted to options within
   a few menu steps of each unit's current one, repeated around each improvement under a node limit
   and a round limit; kept only if the simulator confirms it is better.
6. Every result is re-simulated with envpipe.plan.simulate; that simulation is what is reported.
7. Single plans come from a ladder of budgets (envpipe.plan.optimal.ladder), so more time never costs more energy.

Every limit inside is a count (passes, rounds, nodes), never a clock: the same input gives the same plan at any
load. The user's wall-clock limit (envpipe.plan.optimal.timelimit, off by default) is the only clock, and the plan says
when it cut the search short.

A per-stage tail (gradient all-reduce, optimizer step after the stage's last unit) enters as the
simulator has it: the iteration ends when every stage has finished its tail, so each stage's last
unit must end by budget - tail (LP and MILP rows, free float, latest schedule).

Files: `problem` (one order's clock problem), `solve` (one order at one budget), `orders` (the best order on
the budget ladder; `optimal_plan`, the entry), `menus`, `lp`, `milp`, `fold`, `ladder`, `frontier` and `timelimit`.
"""
