#!/bin/sh
# Create one JobLease per completion index of an Indexed Job, owned by the Job.
#   examples/indexed-leases.sh JOB PREFIX [DURATION_SECONDS] [MAX_ATTEMPTS]
# PREFIX is the Job template's joblease.dev/lease label; index i gets PREFIX-i.
# The owner reference is the grant: the operator holds PREFIX-i only for pods of this very
# Job (its uid), and the leases are deleted with the Job (docs/indexed-jobs.md).
# Needs `kubectl` allowed to get jobs and create jobleases in the namespace (-n via
# KUBECTL_ARGS, e.g. KUBECTL_ARGS="-n batch").
set -eu
job=$1 prefix=$2 duration=${3:-15} attempts=${4:-4}
args=${KUBECTL_ARGS:-}
# shellcheck disable=SC2086  # KUBECTL_ARGS is meant to split into words
uid=$(kubectl $args get job "$job" -o jsonpath='{.metadata.uid}')
# shellcheck disable=SC2086
completions=$(kubectl $args get job "$job" -o jsonpath='{.spec.completions}')
i=0
while [ "$i" -lt "$completions" ]; do
  cat <<YAML
---
apiVersion: joblease.dev/v1alpha1
kind: JobLease
metadata:
  name: $prefix-$i
  labels: {joblease.dev/job: "$job", joblease.dev/completion-index: "$i"}
  ownerReferences:
    - {apiVersion: batch/v1, kind: Job, name: "$job", uid: "$uid"}
spec:
  leaseDurationSeconds: $duration
  maxAttempts: $attempts
  podDelegation: {enabled: true}
  description: index $i of Job $job
YAML
  i=$((i + 1))
done | kubectl $args create -f -
