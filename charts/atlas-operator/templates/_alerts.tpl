{{/*
The Atlas alerting rules: the `groups` of a Prometheus rules file. The one source of both the PrometheusRule
(templates/prometheusrule.yaml) and the plain rules file monitoring/atlas-alerts.rules.yaml (this template
rendered with the chart's defaults; a test keeps the two identical). Thresholds are .Values.alerts.
Run series carry namespace, run and kind (the trainer's own labels, kept by the PodMonitor's honorLabels).
*/}}
{{- define "atlas-operator.alertGroups" -}}
{{- $a := .Values.alerts -}}
{{- $job := default (printf "%s-metrics" (include "atlas-operator.fullname" .)) $a.operatorJob -}}
{{- $runbook := $a.runbookUrl -}}
groups:
  - name: atlas-runs
    rules:
      {{- with $a.runFailed }}{{ if .enabled }}
      - alert: AtlasRunFailed
        expr: max by (kind, namespace, run) (atlas_operator_run_phase{phase="Failed"}) == 1
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas run failed
          description: '{{`{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.run }}`}} is Failed: its job ran out of restarts or failed for good.'
          runbook: 'kubectl -n {{`{{ $labels.namespace }}`}} describe {{`{{ $labels.kind | toLower }}`}} {{`{{ $labels.run }}`}} (the Training condition and Events say why); the trainer log of rank 0 has the error.'
          runbook_url: {{ $runbook }}#atlasrunfailed
      {{- end }}{{ end }}
      {{- with $a.runStalled }}{{ if .enabled }}
      - alert: AtlasRunStalled
        expr: time() - max by (kind, namespace, run) (atlas_training_last_step_timestamp_seconds) > {{ .noStepForSeconds }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas run stalled
          description: '{{`{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.run }}`}} has completed no optimizer step for {{`{{ $value | humanizeDuration }}`}} while its trainer is up (limit {{ .noStepForSeconds }} s).'
          runbook: 'Read rank 0''s log for what it waits on (a reward judge, the student or rollout server, a collective); the step watchdog (spec.training.stepTimeoutSeconds) ends the process with its stacks.'
          runbook_url: {{ $runbook }}#atlasrunstalled
      {{- end }}{{ end }}
      {{- with $a.rewardCollapse }}{{ if .enabled }}
      - alert: AtlasRewardCollapse
        expr: |-
          avg by (kind, namespace, run) (avg_over_time(atlas_training_reward[{{ .recent }}]))
            < avg by (kind, namespace, run) (avg_over_time(atlas_training_reward[{{ .baseline }}] offset {{ .recent }})) - {{ .drop }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas run's reward collapsed
          description: '{{`{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.run }}`}}: the mean reward of the last {{ .recent }} is {{`{{ $value | printf "%.3f" }}`}}, more than {{ .drop }} below its mean over the {{ .baseline }} before.'
          runbook: 'Look at KL, completion length and the reward functions or judges on the dashboard; resume from a checkpoint before the collapse with a lower learning rate or a larger beta.'
          runbook_url: {{ $runbook }}#atlasrewardcollapse
      {{- end }}{{ end }}
      {{- with $a.klBlowUp }}{{ if .enabled }}
      - alert: AtlasKLBlowUp
        expr: max by (kind, namespace, run) (atlas_training_kl) > {{ .threshold }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas run's KL to the reference blew up
          description: '{{`{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.run }}`}}: KL to the reference model is {{`{{ $value | printf "%.3f" }}`}} (limit {{ .threshold }}).'
          runbook: 'The policy is drifting from the reference: check the reward for hacking, lower the learning rate or raise spec.training.beta.'
          runbook_url: {{ $runbook }}#atlasklblowup
      {{- end }}{{ end }}
      {{- with $a.teachingDegradation }}{{ if .enabled }}
      - alert: AtlasTeachingDegradationHigh
        expr: avg by (kind, namespace, run) (avg_over_time(atlas_teaching_degradation_rate[{{ .window }}])) > {{ .rate }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas teacher makes its student worse too often
          description: '{{`{{ $labels.namespace }}/{{ $labels.run }}`}}: guidance made the student worse on {{`{{ $value | humanizePercentage }}`}} of tasks over {{ .window }} (limit {{ .rate }}).'
          runbook: 'Check the teaching reward and guidance length; raise spec.teaching.degradationPenalty, or evaluate (atlas eval) a checkpoint from before the rise.'
          runbook_url: {{ $runbook }}#atlasteachingdegradationhigh
      {{- end }}{{ end }}
      {{- with $a.judgeErrors }}{{ if .enabled }}
      - alert: AtlasRIMJudgeErrorsHigh
        expr: |-
          sum by (namespace, run) (rate(atlas_rim_judge_errors_total[{{ .window }}]))
            / sum by (namespace, run) (rate(atlas_rim_judge_calls_total[{{ .window }}])) > {{ .ratio }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas RIM judges are failing
          description: '{{`{{ $labels.namespace }}/{{ $labels.run }}`}}: {{`{{ $value | humanizePercentage }}`}} of RIM judge calls failed after retries over {{ .window }} (limit {{ .ratio }}); failed judges score the fallback, so rewards are wrong.'
          runbook: 'Check the judge endpoints of the reward config (small_model, large_model): reachability, rate limits, API key Secret.'
          runbook_url: {{ $runbook }}#atlasrimjudgeerrorshigh
      {{- end }}{{ end }}
  - name: atlas-operator
    rules:
      {{- with $a.operatorDown }}{{ if .enabled }}
      - alert: AtlasOperatorDown
        expr: absent(up{job="{{ $job }}"} == 1)
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas operator is down
          description: 'No scrape target of job {{ $job }} is up: runs are not reconciled, their status and progress are not updated.'
          runbook: 'kubectl get pods -l app.kubernetes.io/component=operator in the release namespace; read its log and Events.'
          runbook_url: {{ $runbook }}#atlasoperatordown
      {{- end }}{{ end }}
      {{- with $a.reconcileErrors }}{{ if .enabled }}
      - alert: AtlasOperatorReconcileErrors
        expr: |-
          sum by (kind) (rate(atlas_operator_reconcile_total{job="{{ $job }}", result="error"}[{{ .window }}]))
            / sum by (kind) (rate(atlas_operator_reconcile_total{job="{{ $job }}"}[{{ .window }}])) > {{ .ratio }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas operator's reconciles fail
          description: '{{`{{ $value | humanizePercentage }}`}} of {{`{{ $labels.kind }}`}} reconciles failed over {{ .window }} (limit {{ .ratio }}).'
          runbook: 'The operator log names the failing run and the API error (RBAC, a missing CRD, an admission webhook).'
          runbook_url: {{ $runbook }}#atlasoperatorreconcileerrors
      {{- end }}{{ end }}
      {{- with $a.reconcileLatency }}{{ if .enabled }}
      - alert: AtlasOperatorReconcileSlow
        expr: |-
          histogram_quantile(0.95, sum by (le, kind) (rate(atlas_operator_reconcile_duration_seconds_bucket{job="{{ $job }}"}[{{ .window }}]))) > {{ .p95Seconds }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
          {{- with $a.additionalLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: Atlas operator's reconciles are slow
          description: '95% of {{`{{ $labels.kind }}`}} reconciles took up to {{`{{ $value | humanizeDuration }}`}} over {{ .window }} (limit {{ .p95Seconds }} s).'
          runbook: 'A slow API server or trainer metrics endpoint; check the operator''s CPU limit and the API server''s latency.'
          runbook_url: {{ $runbook }}#atlasoperatorreconcileslow
      {{- end }}{{ end }}
{{- end -}}
