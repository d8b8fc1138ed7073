"""Tasks: what to compute (definition), on which shapes (workloads), and the naive kernel per target."""

from ksearch.tasks.definition import Definition, Workload, WorkloadCost
from ksearch.tasks.loader import Task, builtin_names, load_definition, load_task, load_workloads

__all__ = ["Definition", "Workload", "WorkloadCost", "Task", "builtin_names", "load_definition", "load_task",
           "load_workloads"]
